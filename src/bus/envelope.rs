//! The OVOS-MSG-1 envelope: `{"type", "data", "context"}`, strict decoding and
//! the forward / reply / response derivations.
//!
//! Decoding is strict because the bus carries whatever any client writes: a frame
//! that is not a JSON object, has a missing, empty or non-string `type`, or a
//! non-object `data`/`context` is rejected with a [`DecodeError`] that says which
//! rule it broke. An absent or `null` `data`/`context` is `{}`.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// A JSON object, the type of `data` and `context`.
pub type Object = Map<String, Value>;

/// One bus message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// The topic, e.g. `ovos.tools.invoke`. Never empty.
    pub msg_type: String,
    /// The payload; what a topic's specification defines.
    pub data: Object,
    /// Routing and session information; carried unchanged into answers.
    pub context: Object,
}

/// Why a frame is not an OVOS-MSG-1 envelope.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("frame is not valid JSON: {0}")]
    NotJson(String),
    #[error("frame is JSON but not an object")]
    NotObject,
    #[error("frame has no \"type\"")]
    MissingType,
    #[error("frame's \"type\" is not a non-empty string")]
    BadType,
    #[error("frame's \"{0}\" is not an object")]
    NotAnObject(&'static str),
    #[error("frame has \"{0}\" twice, which would let a reader and a router disagree")]
    Duplicate(&'static str),
}

impl Message {
    /// A new message with empty context.
    pub fn new(msg_type: impl Into<String>, data: Object) -> Message {
        Message {
            msg_type: msg_type.into(),
            data,
            context: Object::new(),
        }
    }

    /// Decodes one websocket text frame.
    pub fn decode(text: &str) -> Result<Message, DecodeError> {
        // A struct deserializer refuses a key given twice ("duplicate field"),
        // which a map (last one wins) would let through.
        #[derive(serde::Deserialize)]
        struct Envelope {
            // A `"type": null` is present (a bad type), not absent, as in
            // `from_value`: an Option would read null as absent.
            #[serde(rename = "type", default, deserialize_with = "present")]
            msg_type: Option<Value>,
            data: Option<Value>,
            context: Option<Value>,
        }
        let envelope = match serde_json::from_str::<Envelope>(text) {
            Ok(envelope) if text.trim_start().starts_with('{') => envelope,
            // Only on the error path: say exactly what is wrong.
            Ok(_) => return Err(DecodeError::NotObject),
            Err(e) => {
                let value: Value =
                    serde_json::from_str(text).map_err(|e| DecodeError::NotJson(e.to_string()))?;
                if !value.is_object() {
                    return Err(DecodeError::NotObject);
                }
                let message = e.to_string();
                for key in ["type", "data", "context"] {
                    if message.starts_with(&format!("duplicate field `{key}`")) {
                        return Err(DecodeError::Duplicate(key));
                    }
                }
                return Message::from_value(value);
            }
        };
        Ok(Message {
            msg_type: message_type(envelope.msg_type)?,
            data: object_or_empty(envelope.data, "data")?,
            context: object_or_empty(envelope.context, "context")?,
        })
    }

    /// Decodes one frame as [`Message::decode`] does, but builds only the
    /// `data` members named in `keep` ([`Unbuilt`]).
    pub fn decode_keeping(text: &str, keep: &[&str]) -> Result<Message, DecodeError> {
        Unbuilt::read(text, keep).build()
    }

    /// Checks an already parsed JSON value against the envelope rules.
    pub fn from_value(value: Value) -> Result<Message, DecodeError> {
        let Value::Object(mut obj) = value else {
            return Err(DecodeError::NotObject);
        };
        let msg_type = message_type(obj.remove("type"))?;
        let data = take_object(&mut obj, "data")?;
        let context = take_object(&mut obj, "context")?;
        Ok(Message {
            msg_type,
            data,
            context,
        })
    }

    /// Encodes the message as one websocket text frame.
    pub fn encode(&self) -> String {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            #[serde(rename = "type")]
            msg_type: &'a str,
            data: &'a Object,
            context: &'a Object,
        }
        let wire = Wire {
            msg_type: &self.msg_type,
            data: &self.data,
            context: &self.context,
        };
        // invariant: a struct of strings and JSON maps always serializes.
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Encodes the message with `data` given as already serialized JSON (an
    /// object), ignoring `self.data`: large answers are spliced, not rebuilt.
    pub fn encode_with_raw_data(&self, data: &str) -> String {
        // invariant: strings and JSON maps always serialize.
        let msg_type = serde_json::to_string(&self.msg_type).unwrap_or_default();
        let context = serde_json::to_string(&self.context).unwrap_or_default();
        let mut out = String::with_capacity(msg_type.len() + data.len() + context.len() + 32);
        out.push_str("{\"type\":");
        out.push_str(&msg_type);
        out.push_str(",\"data\":");
        out.push_str(data);
        out.push_str(",\"context\":");
        out.push_str(&context);
        out.push('}');
        out
    }

    /// OVOS-MSG-1 forward: a new topic and payload, the context copied unchanged.
    pub fn forward(&self, msg_type: impl Into<String>, data: Object) -> Message {
        Message {
            msg_type: msg_type.into(),
            data,
            context: self.context.clone(),
        }
    }

    /// OVOS-MSG-1 reply: the context copied, then the routing pair swapped.
    ///
    /// If the request had `destination`, the new `source` is that destination
    /// (its first element when it is a list); if the request had `source`, the new
    /// `destination` is that source. A key the request lacked keeps its copied
    /// value (or stays absent). Every other key, `session` included, is carried
    /// unchanged and nothing is added.
    pub fn reply(&self, msg_type: impl Into<String>, data: Object) -> Message {
        let mut context = self.context.clone();
        if let Some(destination) = self.context.get("destination") {
            let source = match destination {
                Value::Array(items) => items.first().cloned().unwrap_or(Value::Null),
                other => other.clone(),
            };
            context.insert("source".to_owned(), source);
        }
        if let Some(source) = self.context.get("source") {
            context.insert("destination".to_owned(), source.clone());
        }
        Message {
            msg_type: msg_type.into(),
            data,
            context,
        }
    }

    /// OVOS-MSG-1 response: a reply on the topic suffixed with `.response`.
    pub fn response(&self, data: Object) -> Message {
        self.reply(format!("{}.response", self.msg_type), data)
    }

    /// `self.response(data).encode()`, without copying the context: the
    /// answer to every call goes through here, and an OVOS context (a whole
    /// session) is often larger than the answer.
    pub fn encode_response(&self, data: &Object) -> String {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            #[serde(rename = "type")]
            msg_type: &'a str,
            data: &'a Object,
            context: ReplyContext<'a>,
        }
        let wire = Wire {
            msg_type: &format!("{}.response", self.msg_type),
            data,
            context: ReplyContext(&self.context),
        };
        // invariant: a struct of strings and JSON maps always serializes.
        serde_json::to_string(&wire).unwrap_or_default()
    }
}

/// A request's context as its reply carries it (see [`Message::reply`]),
/// serialized from the request's without a copy.
struct ReplyContext<'a>(&'a Object);

impl serde::Serialize for ReplyContext<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let context = self.0;
        let source = context.get("destination").map(|d| match d {
            Value::Array(items) => items.first().unwrap_or(&Value::Null),
            other => other,
        });
        let destination = context.get("source");
        let mut entries: Vec<(&str, &Value)> = context
            .iter()
            .map(|(k, v)| {
                let v = match k.as_str() {
                    "source" => source.unwrap_or(v),
                    "destination" => destination.unwrap_or(v),
                    _ => v,
                };
                (k.as_str(), v)
            })
            .collect();
        for (key, value) in [("source", source), ("destination", destination)] {
            if let (Some(value), false) = (value, context.contains_key(key)) {
                entries.push((key, value));
            }
        }
        // The order a copied and amended map would have.
        entries.sort_unstable_by_key(|(k, _)| *k);
        let mut map = serializer.serialize_map(Some(entries.len()))?;
        for (key, value) in entries {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// A member that is there, whatever its value (null included).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    <Value as serde::Deserialize>::deserialize(deserializer).map(Some)
}

/// A frame read once, without building its trees: the `data` members a
/// reader keeps and the context, as the text they are in. What they will
/// hold once built can be told ([`Unbuilt::text_bytes`]) before anything is
/// built ([`Unbuilt::build`]); the other `data` members (a client's padding)
/// are skipped as they are read, never built. A frame that cannot be read
/// so (not an object, a key twice) is kept whole, for [`Message::decode`]
/// to give its error.
pub struct Unbuilt<'a>(Read<'a>);

enum Read<'a> {
    Parts {
        msg_type: Option<Value>,
        data: Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>,
        context: Option<&'a RawValue>,
    },
    NotObject,
    Whole(&'a str),
}

impl<'a> Unbuilt<'a> {
    /// Reads `text`, keeping the `data` members `keep` names.
    pub fn read(text: &'a str, keep: &[&str]) -> Unbuilt<'a> {
        use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
        type Members<'a> = Vec<(std::borrow::Cow<'a, str>, &'a RawValue)>;
        /// `data`'s members that `keep` names, as text.
        struct Kept<'k>(&'k [&'k str]);
        impl<'de> DeserializeSeed<'de> for Kept<'_> {
            type Value = Members<'de>;
            fn deserialize<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }
        }
        impl<'de> Visitor<'de> for Kept<'_> {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut kept: Members<'de> = Vec::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if self.0.contains(&key.as_ref()) {
                        if kept.iter().any(|(k, _)| *k == key) {
                            return Err(serde::de::Error::custom("a data key twice"));
                        }
                        kept.push((key, map.next_value()?));
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(kept)
            }
        }
        #[derive(serde::Deserialize)]
        struct Envelope<'a> {
            #[serde(rename = "type", default, deserialize_with = "present")]
            msg_type: Option<Value>,
            #[serde(borrow)]
            data: Option<&'a RawValue>,
            #[serde(borrow)]
            context: Option<&'a RawValue>,
        }
        let whole = Unbuilt(Read::Whole(text));
        let Ok(envelope) = serde_json::from_str::<Envelope>(text) else {
            return whole;
        };
        if !text.trim_start().starts_with('{') {
            return whole;
        }
        let data = match envelope.data.map(|raw| raw.get().trim_start()) {
            None => Vec::new(),
            Some(raw) if raw.starts_with("null") => Vec::new(),
            Some(raw) if raw.starts_with('{') => {
                let mut reader = serde_json::Deserializer::from_str(raw);
                match Kept(keep).deserialize(&mut reader) {
                    Ok(data) => data,
                    Err(_) => return whole,
                }
            }
            Some(_) => return Unbuilt(Read::NotObject),
        };
        Unbuilt(Read::Parts {
            msg_type: envelope.msg_type,
            data,
            context: envelope.context,
        })
    }

    /// The text of what [`Unbuilt::build`] builds: the kept members and the
    /// context (the whole frame when it could not be read so).
    pub fn text_bytes(&self) -> usize {
        match &self.0 {
            Read::Parts { data, context, .. } => {
                data.iter().map(|(_, raw)| raw.get().len()).sum::<usize>()
                    + context.map_or(0, |c| c.get().len())
            }
            Read::NotObject => 0,
            Read::Whole(text) => text.len(),
        }
    }

    /// The message, with only the kept `data` members.
    pub fn build(self) -> Result<Message, DecodeError> {
        let (msg_type, members, context) = match self.0 {
            Read::Parts {
                msg_type,
                data,
                context,
            } => (msg_type, data, context),
            Read::NotObject => return Err(DecodeError::NotAnObject("data")),
            Read::Whole(text) => return Message::decode(text),
        };
        let parse = |raw: &RawValue| {
            serde_json::from_str::<Value>(raw.get())
                .map_err(|e| DecodeError::NotJson(e.to_string()))
        };
        let mut data = Object::new();
        for (key, raw) in members {
            data.insert(key.into_owned(), parse(raw)?);
        }
        let context = context.map(parse).transpose()?;
        Ok(Message {
            msg_type: message_type(msg_type)?,
            data,
            context: object_or_empty(context, "context")?,
        })
    }
}

/// An envelope's `type`: present, a string, not empty.
fn message_type(value: Option<Value>) -> Result<String, DecodeError> {
    match value {
        None => Err(DecodeError::MissingType),
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        Some(_) => Err(DecodeError::BadType),
    }
}

fn take_object(obj: &mut Object, key: &'static str) -> Result<Object, DecodeError> {
    object_or_empty(obj.remove(key), key)
}

/// An envelope member: absent or null is `{}`; anything but an object is an error.
fn object_or_empty(value: Option<Value>, key: &'static str) -> Result<Object, DecodeError> {
    match value {
        None | Some(Value::Null) => Ok(Object::new()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(DecodeError::NotAnObject(key)),
    }
}

/// Builds an [`Object`] from `key => value` pairs.
#[macro_export]
macro_rules! object {
    ($($key:expr => $value:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut map = $crate::bus::envelope::Object::new();
        $( map.insert(($key).to_string(), serde_json::Value::from($value)); )*
        map
    }};
}

/// The topic of a frame that starts `{"type": "<topic>"` with no escapes in it,
/// as every OVOS client writes them; `None` means "parse to find out".
pub fn leading_type(frame: &str) -> Option<&str> {
    let rest = frame.strip_prefix("{\"type\":")?;
    let rest = rest.strip_prefix(' ').unwrap_or(rest).strip_prefix('"')?;
    let end = rest.find(['"', '\\'])?;
    (rest.as_bytes()[end] == b'"').then(|| &rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decode_keeping_builds_only_the_kept_data_and_errs_as_decode() {
        let keep = ["name", "kwargs"];
        let frame = r#"{"type": "t", "data": {"name": "add", "pad": [1, {"deep": [2]}], "kwargs": {"a": 1}}, "context": {"s": 1}}"#;
        let m = Message::decode_keeping(frame, &keep).unwrap();
        assert_eq!(
            Value::Object(m.data),
            json!({"name": "add", "kwargs": {"a": 1}})
        );
        assert_eq!(Value::Object(m.context), json!({"s": 1}));
        assert_eq!(m.msg_type, "t");
        for bad in [
            r#"[1]"#,
            r#"{"data": {}}"#,
            r#"{"type": "", "data": {}}"#,
            r#"{"type": "t", "data": [1]}"#,
            r#"{"type": "t", "context": 3}"#,
            r#"{"type": "t", "type": "u"}"#,
            "not json",
        ] {
            let keeping = Message::decode_keeping(bad, &keep);
            assert!(keeping.is_err(), "{bad}");
            if let Err(decoded) = Message::decode(bad) {
                assert_eq!(keeping.unwrap_err(), decoded, "{bad}");
            }
        }
        let empty = Message::decode_keeping(r#"{"type": "t", "data": null}"#, &keep).unwrap();
        assert!(empty.data.is_empty());
    }

    fn msg(context: Value) -> Message {
        Message::decode(&json!({"type": "t", "data": {}, "context": context}).to_string()).unwrap()
    }

    #[test]
    fn encode_response_is_the_response_derivation_encoded() {
        let data: Object = json!({"name": "add", "result": {"r": 1}})
            .as_object()
            .unwrap()
            .clone();
        for context in [
            json!({}),
            json!({"source": "persona"}),
            json!({"destination": "skills"}),
            json!({"destination": ["a", "b"], "mark": 1}),
            json!({"destination": [], "source": "x"}),
            json!({"source": "s", "destination": "d", "session": {"session_id": "k"}, "z": 0}),
        ] {
            let m = msg(context.clone());
            assert_eq!(
                m.encode_response(&data),
                m.response(data.clone()).encode(),
                "{context}"
            );
        }
    }

    #[test]
    fn decode_defaults_absent_and_null_data_and_context() {
        let m = Message::decode(r#"{"type":"a"}"#).unwrap();
        assert!(m.data.is_empty() && m.context.is_empty());
        let m = Message::decode(r#"{"type":"a","data":null,"context":null}"#).unwrap();
        assert!(m.data.is_empty() && m.context.is_empty());
    }

    #[test]
    fn arrays_empty_types_and_kept_members() {
        // serde could build the envelope struct from an array: refuse it.
        assert_eq!(
            Message::decode(r#"["t", {}, {}]"#),
            Err(DecodeError::NotObject)
        );
        assert_eq!(
            Message::decode(r#"{"type": ""}"#),
            Err(DecodeError::BadType)
        );
        assert_eq!(
            Message::from_value(serde_json::json!({"type": ""})),
            Err(DecodeError::BadType)
        );
        assert_eq!(
            Message::from_value(serde_json::json!({"type": 7})),
            Err(DecodeError::BadType)
        );
        let m = Message::from_value(
            serde_json::json!({"type": "a", "data": {"n": 1}, "context": {"c": 2}}),
        )
        .unwrap();
        assert_eq!(
            (m.data["n"].clone(), m.context["c"].clone()),
            (1.into(), 2.into())
        );
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        assert_eq!(
            Message::decode(r#"{"type":"ovos.tools.list","data":{},"type":"x.y"}"#),
            Err(DecodeError::Duplicate("type"))
        );
        assert_eq!(
            Message::decode(r#"{"type":"a","data":{},"data":{"n":1}}"#),
            Err(DecodeError::Duplicate("data"))
        );
        assert_eq!(
            Message::decode(r#"{"type":"a","context":{},"context":{}}"#),
            Err(DecodeError::Duplicate("context"))
        );
        // Other keys are free, and kept out of the message.
        let m = Message::decode(r#"{"type":"a","x":1,"x":2}"#).unwrap();
        assert_eq!(m.msg_type, "a");
    }

    #[test]
    fn decode_rejects_every_malformed_shape() {
        assert!(matches!(
            Message::decode("not json"),
            Err(DecodeError::NotJson(_))
        ));
        assert_eq!(Message::decode("[1,2]"), Err(DecodeError::NotObject));
        assert_eq!(Message::decode("\"x\""), Err(DecodeError::NotObject));
        assert_eq!(Message::decode("{}"), Err(DecodeError::MissingType));
        // A null type is there, and not a string (as from_value says).
        assert_eq!(
            Message::decode(r#"{"type":null}"#),
            Err(DecodeError::BadType)
        );
        assert_eq!(Message::decode(r#"{"type":""}"#), Err(DecodeError::BadType));
        assert_eq!(Message::decode(r#"{"type":3}"#), Err(DecodeError::BadType));
        assert_eq!(
            Message::decode(r#"{"type":"a","data":[1]}"#),
            Err(DecodeError::NotAnObject("data"))
        );
        assert_eq!(
            Message::decode(r#"{"type":"a","context":"x"}"#),
            Err(DecodeError::NotAnObject("context"))
        );
    }

    #[test]
    fn encode_round_trips() {
        let m = msg(json!({"session": {"session_id": "s"}}));
        assert_eq!(Message::decode(&m.encode()).unwrap(), m);
    }

    #[test]
    fn raw_data_encoding_equals_the_normal_one() {
        let mut m = msg(json!({"source": "A"})).response(Object::new());
        let raw = "{\"tools\":[{\"name\":\"x\"}]}";
        let spliced = Message::decode(&m.encode_with_raw_data(raw)).unwrap();
        m.data = serde_json::from_str(raw).unwrap();
        assert_eq!(spliced, m);
    }

    #[test]
    fn response_swaps_source_and_destination() {
        let r = msg(json!({"source": "A", "destination": "B"})).response(Object::new());
        assert_eq!(r.msg_type, "t.response");
        assert_eq!(r.context["source"], "B");
        assert_eq!(r.context["destination"], "A");
    }

    #[test]
    fn response_to_source_only_targets_the_source() {
        let r = msg(json!({"source": "A"})).response(Object::new());
        assert_eq!(r.context["source"], "A");
        assert_eq!(r.context["destination"], "A");
    }

    #[test]
    fn response_to_destination_only_keeps_destination() {
        let r = msg(json!({"destination": "B"})).response(Object::new());
        assert_eq!(r.context["source"], "B");
        assert_eq!(r.context["destination"], "B");
    }

    #[test]
    fn list_destination_gives_its_first_element_as_source() {
        let r = msg(json!({"source": "A", "destination": ["B", "C"]})).response(Object::new());
        assert_eq!(r.context["source"], "B");
        assert_eq!(r.context["destination"], "A");
        let r = msg(json!({"destination": ["B", "C"]})).response(Object::new());
        assert_eq!(r.context["source"], "B");
        assert_eq!(r.context["destination"], json!(["B", "C"]));
    }

    #[test]
    fn absent_keys_stay_absent_and_nothing_is_added() {
        let r = msg(json!({})).response(Object::new());
        assert!(r.context.is_empty(), "{:?}", r.context);
    }

    #[test]
    fn session_and_foreign_keys_are_carried_unchanged() {
        let ctx = json!({"source": "A", "destination": "B",
                         "session": {"session_id": "s1", "lang": "pt-PT"},
                         "x-trace": [1, {"y": null}]});
        let r = msg(ctx.clone()).response(Object::new());
        assert_eq!(r.context["session"], ctx["session"]);
        assert_eq!(r.context["x-trace"], ctx["x-trace"]);
        assert_eq!(r.context.len(), 4);
    }

    #[test]
    fn forward_copies_context_verbatim() {
        let m = msg(json!({"source": "A", "destination": "B"}));
        let f = m.forward("u", object! {"k" => 1});
        assert_eq!(f.context, m.context);
        assert_eq!(f.data["k"], 1);
    }

    #[test]
    fn reply_uses_the_given_topic() {
        let r = msg(json!({"source": "A"})).reply("other", Object::new());
        assert_eq!(r.msg_type, "other");
        assert_eq!(r.context["destination"], "A");
    }

    #[test]
    fn leading_type_reads_only_plain_prefixes() {
        assert_eq!(leading_type(r#"{"type":"a.b","data":{}}"#), Some("a.b"));
        assert_eq!(leading_type(r#"{"type": "a.b", "data": {}}"#), Some("a.b"));
        assert_eq!(leading_type(r#"{"type":"a\"b"}"#), None);
        assert_eq!(leading_type(r#"{"data":{},"type":"a"}"#), None);
    }
}
