//! MCP progress, as data: `_meta.progressToken` on a request, and the
//! `notifications/progress` a server sends about it.

use serde_json::{Number, Value};

/// Longest `message` kept from a progress notification, in characters: it
/// is for a person to read, and goes out on the bus.
pub const MESSAGE_MAX_CHARS: usize = 500;

/// Where a request stands, as its server reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// How far along: a number that grows with each notification.
    pub progress: Number,
    /// What `progress` counts up to, when the server knows.
    pub total: Option<Number>,
    /// Words for a person, cut to `MESSAGE_MAX_CHARS`.
    pub message: Option<String>,
}

/// Reads `notifications/progress` params: the token (toolboxd sends
/// unsigned integers; a server that echoes it as a string is understood)
/// and the progress. `None` when either is missing or not a number.
pub fn parse_progress(params: &Value) -> Option<(u64, Progress)> {
    let token = params.get("progressToken")?;
    let token = token.as_u64().or_else(|| token.as_str()?.parse().ok())?;
    let number = |key| match params.get(key) {
        Some(Value::Number(n)) => Some(n.clone()),
        _ => None,
    };
    let message = params.get("message").and_then(Value::as_str).map(|m| {
        match m.char_indices().nth(MESSAGE_MAX_CHARS) {
            Some((end, _)) => m[..end].to_owned(),
            None => m.to_owned(),
        }
    });
    Some((
        token,
        Progress {
            progress: number("progress")?,
            total: number("total"),
            message,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_progress_notifications() {
        let (token, p) = parse_progress(&json!({"progressToken": 7, "progress": 2, "total": 5,
                                   "message": "two of five"}))
        .unwrap();
        assert_eq!(token, 7);
        assert_eq!(
            p,
            Progress {
                progress: 2.into(),
                total: Some(5.into()),
                message: Some("two of five".into()),
            }
        );
        let (token, p) = parse_progress(&json!({"progressToken": "9", "progress": 0.5})).unwrap();
        assert_eq!((token, p.total, p.message), (9, None, None));
        assert_eq!(p.progress.as_f64(), Some(0.5));
        assert!(parse_progress(&json!({"progressToken": "abc", "progress": 1})).is_none());
        assert!(parse_progress(&json!({"progressToken": 1, "progress": "1"})).is_none());
        assert!(parse_progress(&json!({"progress": 1})).is_none());
        let long = "é".repeat(MESSAGE_MAX_CHARS + 10);
        let (_, p) =
            parse_progress(&json!({"progressToken": 1, "progress": 1, "message": long})).unwrap();
        assert_eq!(p.message.unwrap().chars().count(), MESSAGE_MAX_CHARS);
    }
}
