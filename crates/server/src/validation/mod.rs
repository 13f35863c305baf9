//! Validation at the edge (TGI's `validation.rs`): one [`validate`] that every generation
//! route calls, so each request goes through the same steps in the same order, and the routes
//! only format what comes out.
//!
//! 1. the `model` names a served model (404 otherwise);
//! 2. the sampling fields ([`params`]: ranges as vLLM checks them, 400 naming the field);
//! 3. the prompt ([`prompt`]): completions' `prompt` shapes and token ids, or chat's
//!    `messages`, template flags and `tools` ([`crate::tools`]) — all before any tokenizer
//!    work;
//! 4. the output structure ([`structured`]: `response_format`, `structured_outputs`,
//!    `guided_*`, or the call grammar of `tool_choice: required` / a named function);
//! 5. admission's precheck (429 when the queue is full, before the expensive part);
//! 6. tokenization (chat: rendering, then tokenizing) on the tokenizer pool, and compiling
//!    the output structure (cached) on the blocking pool;
//! 7. each prompt's output limit against the context and the whole KV cache.
//!
//! The engine receives token ids and [`tokenmill_engine::RequestParams`] only (an output
//! structure as its compiled [`tokenmill_engine::Constraint`]).

pub mod params;
pub mod prompt;
pub mod structured;

pub use params::{Api, MAX_N, MAX_STOP, MAX_STOP_BYTES, Sampling, resolve_max_tokens};
pub use prompt::{ChatPrompt, MAX_PROMPTS, PromptInput, parse_messages, render_prompt};

use crate::error::ApiError;
use crate::generation::GenerationRequest;
use crate::json::Fields;
use crate::state::AppState;
use crate::tools::ToolRequest;
use crate::tools::format::{ToolFormat, ToolPrompting};
use crate::tools::parser::CallStream;
use structured::OutputSpec;
use tokenmill_structured::StructuredOutput;

/// A generation request every check has passed.
pub struct ValidRequest {
    /// Token ids, output limits, `n`, engine parameters and output options: what
    /// [`crate::generation::submit`] takes.
    pub generation: GenerationRequest,
    /// The prompts as the client sent them (completions and `/generate`; empty for chat).
    pub inputs: Vec<PromptInput>,
    /// Completions' `echo`: prepend the prompt (and, with logprobs, its logprobs).
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Chat with tools whose calls are read back from the reply.
    pub tool_calls: Option<ToolCalls>,
}

/// How a chat reply's tool calls are read: the format and the tools it may call.
#[derive(Clone, Debug)]
pub struct ToolCalls {
    pub format: ToolFormat,
    pub names: std::collections::HashSet<String>,
}

impl ToolCalls {
    pub fn stream(&self) -> CallStream {
        CallStream::new(self.format, self.names.clone())
    }
}

impl ValidRequest {
    /// Prompt tokens over all prompts.
    pub fn prompt_tokens(&self) -> usize {
        self.generation.prompts.iter().map(Vec::len).sum()
    }

    /// Whether the client asked for logprobs.
    pub fn wants_logprobs(&self) -> bool {
        self.generation.params.sampling.logprobs.is_some()
    }
}

/// Where the prompt comes from, once parsed.
enum Source {
    Prompts(Vec<PromptInput>),
    Chat(ChatPrompt),
}

/// Runs every check on the body `f` of an `api` request (see the module docs for the order).
pub async fn validate(state: &AppState, f: &Fields, api: Api) -> Result<ValidRequest, ApiError> {
    state.check_model(f.str("model")?)?;
    let tok = state.pool.tokenizer().clone();
    let Sampling {
        n,
        max_tokens,
        mut params,
        output,
        stream,
        include_usage,
    } = params::parse(f, api, &tok)?;
    let mut output_spec = structured::parse(f)?;
    let mut tool_calls = None;
    let source = match api {
        Api::Chat => {
            let (chat, calls) = chat_prompt(f, &tok, &mut output_spec)?;
            tool_calls = calls;
            Source::Chat(chat)
        }
        Api::Completions | Api::Generate => {
            let inputs = prompt::parse_prompts(f.get("prompt"), tok.vocab_size(), "prompt")?;
            if api == Api::Generate && inputs.len() != 1 {
                return Err(ApiError::invalid_param(
                    "prompt",
                    "/generate takes a single prompt",
                ));
            }
            Source::Prompts(inputs)
        }
    };
    let echo = api == Api::Completions && f.bool_or("echo", false)?;
    params.prompt_logprobs = echo && params.sampling.logprobs.is_some();
    let add_special_tokens = f.bool_or("add_special_tokens", api != Api::Chat)?;
    let num_prompts = match &source {
        Source::Prompts(inputs) => inputs.len(),
        Source::Chat(_) => 1,
    };
    state.admission.precheck(num_prompts * n, &state.metrics)?;
    let (inputs, prompts, prompt_param) = match source {
        Source::Prompts(inputs) => {
            let prompts =
                prompt::tokenize_prompts(state, &inputs, add_special_tokens, "prompt").await?;
            (inputs, prompts, "prompt")
        }
        Source::Chat(chat) => {
            let text = chat.render(state).await?;
            let ids = state
                .pool
                .encode(text, add_special_tokens, "messages")
                .await?;
            (Vec::new(), vec![ids], "messages")
        }
    };
    if let Some(spec) = output_spec {
        params.constraint = Some(structured::compile(&state.grammars, spec).await?);
    }
    let cfg = state.engine.config();
    let limits = prompts
        .iter()
        .map(|p| {
            let (len, ctx) = (p.len(), cfg.max_model_len);
            resolve_max_tokens(
                max_tokens,
                len,
                ctx,
                cfg.block_size,
                cfg.num_blocks,
                prompt_param,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ValidRequest {
        generation: GenerationRequest {
            prompts,
            max_tokens: limits,
            n,
            params,
            output,
        },
        inputs,
        echo,
        stream,
        include_usage,
        tool_calls,
    })
}

/// Chat's conversation with its tools: the messages adapted to how the template meets
/// tools, how calls are read back from the reply, and (`required` / a named function) the
/// call grammar as the output structure.
fn chat_prompt(
    f: &Fields,
    tok: &tokenmill_tokenizer::Tokenizer,
    output_spec: &mut Option<OutputSpec>,
) -> Result<(ChatPrompt, Option<ToolCalls>), ApiError> {
    let tools = ToolRequest::parse(f)?;
    let mut chat = ChatPrompt::parse(f)?;
    let prompting = ToolPrompting::for_template(tok.chat_template().map(|t| t.source()));
    chat.prepare_tools(&prompting, tools.as_ref());
    let Some(t) = tools.as_ref().filter(|t| t.parses_calls()) else {
        return Ok((chat, None));
    };
    if let Some(spec) = tool_call_spec(t, &prompting, output_spec.as_ref())? {
        *output_spec = Some(spec);
    }
    let calls = ToolCalls {
        format: prompting.format,
        names: t.callable().iter().map(|t| t.name.clone()).collect(),
    };
    Ok((chat, Some(calls)))
}

/// The call grammar when `tool_choice` is `required` or names a function (which a
/// `response_format` cannot be combined with); `None` for `auto`.
fn tool_call_spec(
    tools: &ToolRequest,
    prompting: &ToolPrompting,
    other: Option<&OutputSpec>,
) -> Result<Option<OutputSpec>, ApiError> {
    use crate::tools::ToolChoice;
    if !matches!(tools.choice, ToolChoice::Required | ToolChoice::Function(_)) {
        return Ok(None);
    }
    if let Some(o) = other {
        return Err(ApiError::invalid_param(
            "tool_choice",
            format!(
                "tool_choice required or a named function cannot be combined with `{}`",
                o.param
            ),
        ));
    }
    Ok(Some(OutputSpec {
        spec: StructuredOutput::Lark(prompting.call_grammar(tools)),
        param: "tools",
    }))
}
