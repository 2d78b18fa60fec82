//! The bus topics of OVOS-TOOLS-1 (docs/protocol.md) and where each is
//! routed: the persona topics, the flat tool service topics, the
//! predecessor per-toolbox topic and the global stop.

use super::ids::valid_id;

pub const DISCOVER: &str = "ovos.persona.tools.discover";
pub const DISCOVER_RESPONSE: &str = "ovos.persona.tools.discover.response";
pub const PERSONA_CALL: &str = "ovos.persona.tools.call";
pub const LIST: &str = "ovos.tools.list";
pub const GET: &str = "ovos.tools.get";
pub const INVOKE: &str = "ovos.tools.invoke";
pub const RELOAD: &str = "ovos.tools.reload";
/// The global stop OVOS sends when the user says "stop" (docs/protocol.md).
pub const STOP: &str = "mycroft.stop";
/// toolboxd asks the person behind a call (DESIGN §5 "Asking the person").
pub const ASK: &str = "ovos.tools.ask";
/// An answer of the person to an [`ASK`].
pub const ASK_RESPONSE: &str = "ovos.tools.ask.response";

/// Which handler a topic goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topic {
    Discover,
    PersonaCall,
    Predecessor(String),
    List,
    Get,
    Invoke,
    Reload,
    Stop,
}

impl Topic {
    /// A tool call: the only request with data of any size (its arguments),
    /// held until answered, and the global stop's to cancel.
    pub fn is_call(&self) -> bool {
        matches!(
            self,
            Topic::PersonaCall | Topic::Predecessor(_) | Topic::Invoke
        )
    }
}

/// Whether toolboxd answers (or takes) bus messages of `topic` itself: such
/// a topic never prewarms a toolbox.
pub fn answers_itself(topic: &str) -> bool {
    topic == DISCOVER_RESPONSE || topic == ASK_RESPONSE || route(topic).is_some()
}

/// The handler a topic goes to, if toolboxd answers it.
pub fn route(topic: &str) -> Option<Topic> {
    Some(match topic {
        DISCOVER => Topic::Discover,
        PERSONA_CALL => Topic::PersonaCall,
        LIST => Topic::List,
        GET => Topic::Get,
        INVOKE => Topic::Invoke,
        RELOAD => Topic::Reload,
        STOP => Topic::Stop,
        other => {
            let id = other
                .strip_prefix("ovos.persona.tools.")?
                .strip_suffix(".call")?;
            if !valid_id(id) {
                return None;
            }
            Topic::Predecessor(id.to_owned())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_topics() {
        assert!(matches!(route(DISCOVER), Some(Topic::Discover)));
        assert!(matches!(route(INVOKE), Some(Topic::Invoke)));
        assert!(
            matches!(route("ovos.persona.tools.math.call"), Some(Topic::Predecessor(id)) if id == "math")
        );
        assert!(route("ovos.persona.tools.call.response").is_none());
        assert!(route("ovos.persona.tools.a.b.call").is_none());
        assert!(route("ovos.tools.invoke.response").is_none());
        assert!(route("ovos.persona.tools.math.call.response").is_none());
    }
}
