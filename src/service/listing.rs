//! The flat tool service's catalog topics: `ovos.tools.list`,
//! `ovos.tools.get` and `ovos.tools.reload`.

use std::sync::Arc;

use serde_json::Value;

use super::replies::Replies;
use crate::bus::envelope::{Message, Object};
use crate::object;
use crate::operator::{self, Operation, Operators};
use crate::pipeline::{Failed, Failure};
use crate::registry::{Registry, Resolved};

/// The catalog as the flat topics show it.
pub(super) struct Listing {
    /// The catalog of hosted toolboxes.
    registry: Arc<Registry>,
    /// The operator channel, for `ovos.tools.reload`.
    operators: Operators,
    /// Where answers go.
    replies: Replies,
}

impl Listing {
    /// The listing of `registry`; reloads go to `operators`.
    pub(super) fn new(registry: Arc<Registry>, operators: Operators, replies: Replies) -> Listing {
        Listing {
            registry,
            operators,
            replies,
        }
    }

    /// `ovos.tools.list`: every listed tool.
    pub(super) fn list(&self, request: &Message) {
        self.respond_with_tools(request, Object::new());
    }

    /// `ovos.tools.get`: one tool's definition, or why not.
    pub(super) fn get(&self, request: &Message) {
        let error = |failure| object! {"error" => Failed::from(failure).text};
        let data = match request.data.get("name").and_then(Value::as_str) {
            None | Some("") => error(Failure::MissingName),
            Some(name) => match self.registry.snapshot().resolve(name) {
                Resolved::One(_, tool) => match tool.definition() {
                    Value::Object(def) => def,
                    _ => Object::new(),
                },
                Resolved::Unknown => error(Failure::UnknownTool {
                    name: name.to_owned(),
                }),
                Resolved::Ambiguous(ids) => error(Failure::Ambiguous {
                    name: name.to_owned(),
                    owners: ids.to_vec(),
                }),
            },
        };
        self.replies.respond(request, data);
    }

    /// `ovos.tools.reload`: the manifests rescanned (through the operator
    /// channel, as any reload), then every tool, what was loaded and what
    /// could not be.
    pub(super) async fn reload(&self, request: &Message) {
        let Ok(operator::Performed::Reloaded(report)) = self.operators.ask(Operation::Reload).await
        else {
            tracing::warn!("reload requested while shutting down; ignored");
            return;
        };
        let catalog = self.registry.snapshot();
        let mut rest = object! {
            "loaded" => report.loaded.clone(),
            "total_tools" => catalog.listed_tool_count(),
        };
        if !report.errors.is_empty() {
            rest.insert("errors".to_owned(), report.errors_json());
        }
        self.respond_with_tools(request, rest);
    }

    /// Answers with `tools` (every listed tool definition) plus `rest`. The
    /// catalog keeps the tools serialized, so a large list is spliced in, not
    /// rebuilt for every answer.
    fn respond_with_tools(&self, request: &Message, rest: Object) {
        let catalog = self.registry.snapshot();
        let mut data = format!("{{\"tools\":{}", catalog.definitions_json());
        let rest = Value::Object(rest).to_string();
        if rest.len() > 2 {
            data.push(',');
            data.push_str(&rest[1..]);
        } else {
            data.push('}');
        }
        let frame = request.response(Object::new()).encode_with_raw_data(&data);
        self.replies.send_answer(request, frame);
    }
}
