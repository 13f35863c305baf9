//! [`GrammarCompiler`]: one per served tokenizer. Compiles a [`StructuredOutput`] into the
//! engine's [`Constraint`] — llguidance's parser for the grammar, with its first token mask
//! computed, so a grammar that cannot produce any output fails here, in the request's
//! validation, and not in the engine. Compiled grammars are cached by their text (a bounded
//! cache, oldest out first): the next request with the same schema starts from the parser
//! and the lexer states the first one built.
//!
//! Compiling can take milliseconds to seconds for a large schema: call [`GrammarCompiler::
//! compile`] off the async runtime and never on the engine thread. llguidance's limits
//! (grammar size, lexer states, per-step fuel) bound its time and memory.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use llguidance::toktrie::TokEnv;
use llguidance::{Matcher, ParserFactory, TokenParser};
use tokenmill_engine::{Constraint, ConstraintState, OutputConstraint, TokenMask};
use tokenmill_tokenizer::Tokenizer;

use crate::error::StructuredError;
use crate::spec::StructuredOutput;
use crate::tok_env::tok_env;

/// Compiled grammars kept.
pub const CACHE_ENTRIES: usize = 256;

pub struct GrammarCompiler {
    factory: ParserFactory,
    cache: Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    grammars: HashMap<String, Constraint>,
    /// Keys, oldest first.
    order: VecDeque<String>,
}

/// A compiled constraint and how it was had.
pub struct Compiled {
    pub constraint: Constraint,
    /// Found in the cache (no compile).
    pub cached: bool,
    /// Time spent compiling (zero when cached).
    pub compile_time: Duration,
}

impl GrammarCompiler {
    pub fn new(tokenizer: &Tokenizer) -> Result<GrammarCompiler, StructuredError> {
        let env = tok_env(tokenizer)?;
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| StructuredError::Tokenizer(e.to_string()))?;
        factory.quiet();
        // Errors go back to clients: the reason, not the parser's state and grammar dump.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarCompiler {
            factory,
            cache: Mutex::new(Cache::default()),
        })
    }

    pub fn tok_env(&self) -> &TokEnv {
        self.factory.tok_env()
    }

    /// The constraint for `spec`, from the cache or compiled now (blocking).
    pub fn compile(&self, spec: &StructuredOutput) -> Result<Compiled, StructuredError> {
        let grammar = spec.grammar()?;
        let key =
            serde_json::to_string(&grammar).map_err(|e| StructuredError::Invalid(e.to_string()))?;
        if let Some(c) = self.lock().grammars.get(&key) {
            return Ok(Compiled {
                constraint: c.clone(),
                cached: true,
                compile_time: Duration::ZERO,
            });
        }
        let t = Instant::now();
        let parser = self.factory.create_parser(grammar).map_err(invalid)?;
        // The first mask: a grammar that allows nothing, or blows its limits at once, fails
        // now; and its lexer states are warm for every request that shares it.
        let mut first = Matcher::new(Ok(parser.clone()));
        let mask = first.compute_mask().map_err(invalid)?;
        if mask.num_set() == 0 {
            return Err(StructuredError::Invalid(
                "the constraint allows no output at all".into(),
            ));
        }
        let constraint = Constraint::new(Arc::new(CompiledGrammar {
            parser: Mutex::new(parser),
            kind: spec.kind(),
        }));
        let compile_time = t.elapsed();
        let mut cache = self.lock();
        if cache
            .grammars
            .insert(key.clone(), constraint.clone())
            .is_none()
        {
            cache.order.push_back(key);
        }
        while cache.order.len() > CACHE_ENTRIES {
            if let Some(old) = cache.order.pop_front() {
                cache.grammars.remove(&old);
            }
        }
        Ok(Compiled {
            constraint,
            cached: false,
            compile_time,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// llguidance's reason, without its `<non-verbose/>` marker.
fn invalid(e: impl std::fmt::Display) -> StructuredError {
    let m = e.to_string();
    StructuredError::Invalid(m.trim_end_matches("<non-verbose/>").trim_end().to_string())
}

/// A grammar's parser at its start; each request runs a clone (sharing the lexer states).
struct CompiledGrammar {
    parser: Mutex<TokenParser>,
    kind: &'static str,
}

impl OutputConstraint for CompiledGrammar {
    fn start(&self) -> Box<dyn ConstraintState> {
        let parser = self
            .parser
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Box::new(GrammarState(Matcher::new(Ok(parser))))
    }

    fn describe(&self) -> String {
        self.kind.to_string()
    }
}

/// One request's llguidance matcher.
struct GrammarState(Matcher);

impl ConstraintState for GrammarState {
    fn fill_mask(&mut self, mask: &mut TokenMask) -> Result<(), String> {
        let allowed = self.0.compute_mask().map_err(|e| e.to_string())?;
        for (dst, src) in mask.words_mut().iter_mut().zip(allowed.as_slice()) {
            *dst = *src;
        }
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<bool, String> {
        self.0.consume_token(token).map_err(|e| e.to_string())?;
        Ok(self.0.is_stopped())
    }
}
