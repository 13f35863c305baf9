//! `namespace()` for chat templates, without the leak of a namespace stored in itself.
//!
//! A minijinja namespace is a mutable map behind an `Arc`. `{% set ns.me = ns %}` (or a list
//! or dict holding `ns`, or two namespaces holding each other) makes an `Arc` cycle. Nothing
//! frees it at the end of a render, so a hostile template would leak memory on every request.
//! (minijinja breaks the cycles of macro closures itself, but not namespaces.)
//!
//! [`namespace`] is the template global. It creates minijinja's own namespace, so
//! `{% set ns.x = ... %}` works as before, and records it for the render running on this
//! thread. [`Render`] spans one render. When it is dropped, after success or error, it sets
//! every attribute that holds a container (anything other than none, a bool, a number, a
//! string or bytes) to none in every namespace the render created.
//!
//! That breaks every cycle:
//! - A namespace can only point at an older value when it is created (its defaults).
//! - So a cycle needs at least one `{% set ns.NAME = ... %}` edge.
//! - Such an edge holds a container under an identifier, which is exactly what gets cleared.
//!
//! A render is synchronous on the calling thread, so a thread-local list is the per-render
//! registry.

use std::cell::RefCell;

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error};

thread_local! {
    static CREATED: RefCell<Vec<Value>> = const { RefCell::new(Vec::new()) };
}

/// The `namespace(...)` template global: minijinja's, recorded for [`Render`]'s cleanup.
pub(crate) fn namespace(defaults: Option<Value>) -> Result<Value, Error> {
    let ns = minijinja::functions::namespace(defaults)?;
    CREATED.with(|c| c.borrow_mut().push(ns.clone()));
    Ok(ns)
}

/// Spans one render on this thread; dropping it breaks the cycles of the namespaces the
/// render created.
pub(crate) struct Render(());

impl Render {
    pub(crate) fn begin() -> Render {
        CREATED.with(|c| c.borrow_mut().clear());
        Render(())
    }
}

impl Drop for Render {
    fn drop(&mut self) {
        let spaces = CREATED.with(|c| std::mem::take(&mut *c.borrow_mut()));
        if spaces.is_empty() {
            return;
        }
        // Sorted and unique (a namespace's defaults may be a map of many keys).
        let mut names = std::collections::BTreeSet::new();
        for ns in &spaces {
            let Ok(keys) = ns.try_iter() else { continue };
            for key in keys {
                let Some(name) = key.as_str() else { continue };
                let held = ns.get_attr(name).unwrap_or_default();
                if is_identifier(name) && is_container(&held) {
                    names.insert(name.to_owned());
                }
            }
        }
        let names: Vec<String> = names.into_iter().collect();
        if names.is_empty() {
            return;
        }
        // `{% set ns.NAME %}` takes its name from the source, so the cleanup is a template:
        // one for every name, or should one name not lex as minijinja's identifier, one per
        // name (a name that fails there could not have been assigned either).
        let ctx = minijinja::context! { spaces => spaces };
        if clear(&names, &ctx).is_err() {
            for name in &names {
                let _ = clear(std::slice::from_ref(name), &ctx);
            }
        }
    }
}

/// Sets `names` to none in every namespace of `ctx.spaces`.
fn clear(names: &[String], ctx: &Value) -> Result<String, Error> {
    let mut source = String::from("{% for ns in spaces %}");
    for name in names {
        source.push_str("{% set ns.");
        source.push_str(name);
        source.push_str(" = none %}");
    }
    source.push_str("{% endfor %}");
    Environment::new().render_str(&source, ctx)
}

/// Whether `value` may (transitively) hold a namespace.
fn is_container(value: &Value) -> bool {
    !matches!(
        value.kind(),
        ValueKind::Undefined
            | ValueKind::None
            | ValueKind::Bool
            | ValueKind::Number
            | ValueKind::String
            | ValueKind::Bytes
    )
}

/// A name `{% set ns.NAME = ... %}` may assign: letters, digits and `_`, not led by a digit
/// (ASCII for minijinja's default lexer, Unicode letters with its `unicode` feature).
fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use minijinja::value::{Object, Value};

    use crate::TokenizerError;
    use crate::chat::ChatTemplate;

    /// Counts its drops: a value a namespace holds is freed only if the namespace is.
    #[derive(Debug)]
    struct Probe(Arc<AtomicUsize>);

    impl Object for Probe {}

    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Renders `source` with a fresh `probe` variable; returns the render and whether the
    /// probe was freed once everything the caller holds is gone.
    fn render(source: &str) -> (Result<String, TokenizerError>, bool) {
        let drops = Arc::new(AtomicUsize::new(0));
        let t = ChatTemplate::new(source, None, None).unwrap();
        let extra = minijinja::context! { probe => Value::from_object(Probe(drops.clone())) };
        let out = t.render_value(Value::from(Vec::<Value>::new()), false, extra);
        drop(t);
        (out, drops.load(Ordering::SeqCst) == 1)
    }

    #[test]
    fn cycles_through_namespaces_are_freed() {
        for source in [
            // The fuzzer's find: a namespace stored in itself.
            "{% set ns = namespace(n=0) %}{% set ns.p = probe %}{% set ns.n = ns %}ok",
            // Through a list and a dict.
            "{% set ns = namespace() %}{% set ns.p = probe %}{% set ns.l = [1, ns] %}ok",
            "{% set ns = namespace() %}{% set ns.p = probe %}{% set ns.d = {'k': ns} %}ok",
            // Two namespaces, one holding the other from its defaults.
            "{% set a = namespace() %}{% set b = namespace(a=a, p=probe) %}{% set a.b = b %}ok",
            // Created in a loop, and cut short by an error after the cycle is made.
            "{% for i in range(3) %}{% set ns = namespace(p=probe) %}{% set ns.me = ns %}\
             {% endfor %}ok",
            "{% set ns = namespace(p=probe) %}{% set ns.me = ns %}{{ raise_exception('no') }}",
            // Through a loop object over the namespace; and through a macro that reads it
            // (minijinja's own closure tracking frees that one: a guard should it stop).
            "{% set ns = namespace(p=probe) %}{% for x in [ns] %}{% set ns.l = loop %}\
             {% endfor %}ok",
            "{% set ns = namespace(p=probe) %}{% macro m() %}{{ ns.p }}{% endmacro %}\
             {% set ns.m = m %}ok",
        ] {
            let (out, freed) = render(source);
            assert!(freed, "{source}: leaked ({out:?})");
            assert!(
                matches!(
                    out.as_deref(),
                    Ok("ok") | Err(TokenizerError::TemplateRaised(_))
                ),
                "{source}: {out:?}"
            );
        }
    }

    #[test]
    fn namespaces_work_as_before() {
        let (out, freed) = render(
            "{% set ns = namespace(found=false, items=[]) %}\
             {% for x in [1, 2, 3] %}{% if x == 2 %}{% set ns.found = true %}{% endif %}\
             {% set ns.items = ns.items + [x] %}{% endfor %}\
             {{ ns.found }} {{ ns.items }} {{ namespace({'a': 1}).a }}{{ namespace(b=2).b }}",
        );
        assert_eq!(out.unwrap(), "True [1, 2, 3] 12");
        assert!(freed);
    }
}
