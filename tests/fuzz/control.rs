//! Part 4, the control protocol (`Operation::parse`, `control::decode_request`).

use super::*;

fn arb_operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        Just(Operation::Status),
        Just(Operation::Reload),
        arb_text().prop_map(Operation::Restart),
        arb_text().prop_map(Operation::Stop),
        arb_text().prop_map(Operation::Start),
        (arb_text(), 1..=toolboxd::process::child::LOG_LINES)
            .prop_map(|(id, lines)| Operation::Logs { id, lines }),
    ]
}

fn arb_request_line() -> impl Strategy<Value = String> {
    (
        prop::option::of(arb_json()),
        prop::option::of(prop_oneof![
            select(&Operation::NAMES[..]).prop_map(Value::from),
            arb_json()
        ]),
        prop::option::of(prop_oneof![
            arb_text().prop_map(|id| json!({ "id": id })),
            arb_json()
        ]),
    )
        .prop_map(|(id, method, params)| {
            let mut request = Map::new();
            request.insert("jsonrpc".into(), "2.0".into());
            for (key, value) in [("id", id), ("method", method), ("params", params)] {
                if let Some(value) = value {
                    request.insert(key.into(), value);
                }
            }
            Value::Object(request).to_string()
        })
}

proptest! {
    #![proptest_config(config())]

    /// Every operation's wire name and params parse back to it, directly and
    /// through the line `toolboxd ctl` sends.
    #[test]
    fn control_operations_round_trip(operation in arb_operation()) {
        prop_assert_eq!(Operation::parse(operation.name(), &operation.params()), Ok(operation.clone()));
        prop_assert_eq!(
            decode_request(&request_line(&operation)),
            (json!(1), Ok(operation))
        );
    }

    /// A method that is not an operation is refused by name, on one line.
    #[test]
    fn control_unknown_methods_are_refused_by_name(
        method in arb_text().prop_filter("not an operation", |m| !Operation::NAMES.contains(&m.as_str())),
        params in arb_json(),
    ) {
        let e = Operation::parse(&method, &params).unwrap_err();
        prop_assert_eq!(&e, &BadRequest::Unknown(method.clone()));
        assert_one_line(&e.to_string());
        let quoted = format!("{method:?}");
        prop_assert!(e.to_string().contains(&quoted));
    }

    /// An operation on a toolbox needs a string params.id; without one it is
    /// refused, naming the operation.
    #[test]
    fn control_operations_on_a_toolbox_need_a_string_id(
        name in select(&["restart", "stop", "start", "logs"][..]),
        params in arb_json().prop_filter("no string id", |p| !p.get("id").is_some_and(Value::is_string)),
    ) {
        prop_assert_eq!(Operation::parse(name, &params), Err(BadRequest::NoId(name)));
    }

    /// Every request line is an operation or a JSON-RPC error with the
    /// request's id and a one-line message: -32700 exactly when the line is
    /// not JSON.
    #[test]
    fn control_decode_request_is_total(line in hostile_text(JSON_PIECES, arb_request_line().boxed())) {
        let (id, decoded) = decode_request(&line);
        match serde_json::from_str::<Value>(&line) {
            Err(_) => {
                prop_assert_eq!(&id, &Value::Null);
                let (code, message) = decoded.unwrap_err();
                prop_assert_eq!(code, -32700);
                prop_assert!(message.starts_with("not JSON: "));
                assert_one_line(&message);
            }
            Ok(request) => {
                prop_assert_eq!(&id, request.get("id").unwrap_or(&Value::Null));
                match decoded {
                    Ok(operation) => prop_assert_eq!(Ok(operation), Operation::from_request(&request)),
                    Err((code, message)) => {
                        prop_assert_eq!(code, -32602);
                        prop_assert_eq!(message, Operation::from_request(&request).unwrap_err().to_string());
                    }
                }
            }
        }
    }
}

#[test]
fn control_hostile_corpus() {
    let decode = |line: &str| {
        let (id, decoded) = decode_request(line);
        if let Err((_, message)) = &decoded {
            assert_one_line(message);
        }
        (id, decoded)
    };
    let error = |line: &str| decode(line).1.unwrap_err();
    assert_eq!(error("not json").0, -32700);
    assert_eq!(error("").0, -32700);
    assert_eq!(error("\u{feff}{\"method\":\"status\"}").0, -32700);
    assert_eq!(error(&nested(10_000, false, true)).0, -32700);
    // A batch is no request.
    assert_eq!(
        decode(r#"[{"jsonrpc":"2.0","id":1,"method":"status"}]"#),
        (Value::Null, Err((-32602, "no method".to_owned())))
    );
    // A method or an id with a newline or an escape sequence: escaped.
    let (_, decoded) = decode(r#"{"id":1,"method":"status\n\u001b[2J"}"#);
    assert_eq!(
        decoded,
        Err((
            -32602,
            "unknown method \"status\\n\\u{1b}[2J\"; use status, restart, stop, start, reload or logs"
                .to_owned()
        ))
    );
    assert_eq!(
        decode(r#"{"id":"7","method":"stop","params":{"id":"a\nb"}}"#),
        (json!("7"), Ok(Operation::Stop("a\nb".to_owned())))
    );
    // Ids of any kind are echoed; params of the wrong kind name the need.
    assert_eq!(
        decode(r#"{"id":{"x":[1]},"method":"restart","params":[{"id":"a"}]}"#),
        (
            json!({"x": [1]}),
            Err((-32602, "restart needs params.id (a toolbox id)".to_owned()))
        )
    );
    assert_eq!(
        decode(r#"{"id":9223372036854775807,"method":"status","params":"x"}"#),
        (json!(i64::MAX), Ok(Operation::Status))
    );
    // "method" twice: the last one counts, as in every JSON map.
    assert_eq!(
        decode(r#"{"method":"stop","method":"status"}"#).1,
        Ok(Operation::Status)
    );
}
