//! Part 2, the MCP line parser (`parse_line`, `parse_tools_page`): what any
//! child sends.

use super::*;

/// Lines close to JSON-RPC: requests, notifications, answers, batches, with
/// ids, methods, results and errors of every kind.
fn arb_rpc_line() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<u64>().prop_map(|n| Value::from(n.to_string())),
        arb_json(),
    ];
    let member =
        |value: BoxedStrategy<Value>| prop_oneof![Just(None::<Value>), value.prop_map(Some)];
    let message = (
        member(id.boxed()),
        member(
            prop_oneof![
                select(
                    &[
                        "tools/call",
                        "roots/list",
                        "notifications/tools/list_changed"
                    ][..]
                )
                .prop_map(Value::from),
                arb_json()
            ]
            .boxed(),
        ),
        member(arb_json().boxed()),
        member(arb_json().boxed()),
        member(
            prop_oneof![
                (any::<i64>(), arb_text(), arb_json())
                    .prop_map(|(c, m, d)| json!({"code": c, "message": m, "data": d})),
                arb_json()
            ]
            .boxed(),
        ),
    )
        .prop_map(|(id, method, params, result, error)| {
            let mut line = Map::new();
            line.insert("jsonrpc".into(), "2.0".into());
            for (key, value) in [
                ("id", id),
                ("method", method),
                ("params", params),
                ("result", result),
                ("error", error),
            ] {
                if let Some(value) = value {
                    line.insert(key.into(), value);
                }
            }
            Value::Object(line)
        })
        .boxed();
    prop_oneof![
        4 => message.clone(),
        1 => prop::collection::vec(prop_oneof![message, arb_json()], 0..4).prop_map(Value::Array),
    ]
    .prop_map(|line| line.to_string())
}

fn hostile_line() -> impl Strategy<Value = Vec<u8>> {
    hostile_bytes(hostile_text(JSON_PIECES, arb_rpc_line().boxed()))
}

proptest! {
    #![proptest_config(config())]

    /// Every line is classified or refused with a typed one-line error, and
    /// the class is the one the line's JSON says: an unusable line (a batch,
    /// too deep) is never taken for junk, nor junk for an unusable line.
    #[test]
    fn mcp_parse_line_is_total_and_classifies_by_the_rules(line in hostile_line()) {
        let parsed = parse_line(&line);
        if let Err(e) = &parsed {
            assert_one_line(&e.to_string());
        }
        match serde_json::from_slice::<Value>(&line) {
            Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
                prop_assert!(matches!(parsed, Err(FrameError::Unusable(_))), "{parsed:?}");
            }
            Err(_) => prop_assert!(matches!(parsed, Err(FrameError::NotJson(_))), "{parsed:?}"),
            Ok(Value::Array(items)) => {
                let batch = items.iter().any(|i| i.get("jsonrpc").is_some());
                if batch {
                    prop_assert!(matches!(parsed, Err(FrameError::Unusable(_))), "{parsed:?}");
                } else {
                    prop_assert_eq!(parsed, Err(FrameError::NotJsonRpc));
                }
            }
            Ok(Value::Object(obj)) => {
                let method = obj.get("method").and_then(Value::as_str);
                let id = obj.get("id").filter(|id| !id.is_null());
                let params = obj.get("params").cloned().unwrap_or(Value::Null);
                match parsed {
                    Ok(Incoming::Request { id: got, method: m, params: p }) => {
                        prop_assert_eq!(Some(m.as_str()), method);
                        prop_assert_eq!(Some(&got), id);
                        prop_assert_eq!(p, params);
                    }
                    Ok(Incoming::Notification { method: m, params: p }) => {
                        prop_assert_eq!(Some(m.as_str()), method);
                        prop_assert!(id.is_none());
                        prop_assert_eq!(p, params);
                    }
                    Ok(Incoming::Response { id: got, result }) => {
                        prop_assert!(!obj.contains_key("method"));
                        let id = &obj["id"];
                        let expected = id.as_u64().or_else(|| id.as_str()?.parse().ok());
                        prop_assert_eq!(got, expected);
                        match result {
                            Ok(result) => {
                                prop_assert!(!obj.contains_key("error"));
                                prop_assert_eq!(Some(&result), obj.get("result"));
                            }
                            Err(e) => {
                                let error = &obj["error"];
                                prop_assert_eq!(e.code, error.get("code").and_then(Value::as_i64).unwrap_or(0));
                                prop_assert_eq!(e.data.as_ref(), error.get("data"));
                            }
                        }
                    }
                    Err(e) => {
                        prop_assert_eq!(&e, &FrameError::NotJsonRpc);
                        // Neither a call to us nor an answer to one.
                        prop_assert!(method.is_none());
                        let answer = obj.contains_key("result") || obj.contains_key("error");
                        prop_assert!(!(obj.contains_key("id") && answer && !obj.contains_key("method")));
                    }
                }
            }
            Ok(_) => prop_assert_eq!(parsed, Err(FrameError::NotJsonRpc)),
        }
    }

    /// What toolboxd writes to a child, a child written the same way is read
    /// back from: requests, notifications and answers keep every field.
    #[test]
    fn mcp_lines_round_trip(id in any::<u64>(), method in arb_text(), params in arb_json(),
                            code in any::<i64>(), message in arb_text()) {
        prop_assert_eq!(
            parse_line(&mcp_request_line(id, &method, &params)),
            Ok(Incoming::Request { id: json!(id), method: method.clone(), params: params.clone() })
        );
        prop_assert_eq!(
            parse_line(&notification_line(&method, &params)),
            Ok(Incoming::Notification { method, params: params.clone() })
        );
        prop_assert_eq!(
            parse_line(&response_line(&json!(id), Ok(params.clone()))),
            Ok(Incoming::Response { id: Some(id), result: Ok(params.clone()) })
        );
        // Ids echoed as strings still name the call.
        prop_assert_eq!(
            parse_line(&response_line(&json!(id.to_string()), Ok(params.clone()))),
            Ok(Incoming::Response { id: Some(id), result: Ok(params) })
        );
        prop_assert_eq!(
            parse_line(&response_line(&json!(id), Err((code, &message)))),
            Ok(Incoming::Response {
                id: Some(id),
                result: Err(RpcError { code, message: message.clone(), data: None }),
            })
        );
    }

    /// An answer nested deeper than a reader may go is unusable (a call may
    /// wait for it), at any depth; within the limit it is read.
    #[test]
    fn mcp_nesting_past_the_limit_is_unusable(depth in 127usize..10_000, object: bool, closed: bool) {
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}", nested(depth, object, closed));
        prop_assert!(matches!(parse_line(line.as_bytes()), Err(FrameError::Unusable(_))));
    }

    #[test]
    fn mcp_nesting_within_the_limit_is_read(depth in 0usize..127, object: bool) {
        let inner = nested(depth, object, true);
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{inner}}}");
        let result: Value = serde_json::from_str(&inner).unwrap();
        prop_assert_eq!(
            parse_line(line.as_bytes()),
            Ok(Incoming::Response { id: Some(1), result: Ok(result) })
        );
    }

    /// A tools/list page gives one entry per listed tool (or one error when
    /// there is no list), each a tool named as listed or a one-line reason.
    #[test]
    fn mcp_tools_page_is_total(page in prop_oneof![
        arb_json(),
        (prop::collection::vec(prop_oneof![
            (arb_text(), arb_json(), prop::option::of(arb_json()))
                .prop_map(|(name, schema, out)| json!({"name": name, "inputSchema": schema, "outputSchema": out})),
            arb_json(),
        ], 0..8), arb_json())
            .prop_map(|(tools, cursor)| json!({"tools": tools, "nextCursor": cursor})),
    ]) {
        let (specs, cursor) = parse_tools_page(&page);
        match page.get("tools").and_then(Value::as_array) {
            Some(tools) => {
                prop_assert_eq!(specs.len(), tools.len());
                for (spec, tool) in specs.iter().zip(tools) {
                    match spec {
                        Ok(spec) => {
                            prop_assert!(!spec.name.is_empty());
                            prop_assert_eq!(Some(spec.name.as_str()), tool["name"].as_str());
                            prop_assert!(spec.input_schema.is_object() || spec.input_schema.is_boolean());
                        }
                        Err(reason) => assert_one_line(reason),
                    }
                }
                let expected = page["nextCursor"].as_str().filter(|c| !c.is_empty());
                prop_assert_eq!(cursor.as_deref(), expected);
            }
            None => {
                prop_assert_eq!(specs.len(), 1);
                prop_assert!(specs[0].is_err());
                prop_assert_eq!(cursor, None);
            }
        }
    }
}

#[test]
fn mcp_hostile_corpus() {
    let parse = |line: &[u8]| {
        let parsed = parse_line(line);
        if let Err(e) = &parsed {
            assert_one_line(&e.to_string());
        }
        parsed
    };
    let unusable = |line: &[u8]| matches!(parse(line), Err(FrameError::Unusable(_)));
    let junk = |line: &[u8]| {
        matches!(
            parse(line),
            Err(FrameError::NotJson(_)) | Err(FrameError::NotJsonRpc)
        )
    };
    // A batch, even of one answer or mixed with junk.
    assert!(unusable(br#"[{"jsonrpc":"2.0","id":1,"result":{}}]"#));
    assert!(unusable(br#"[1,{"jsonrpc":"2.0","method":"x"}]"#));
    assert!(junk(b"[1,2,3]") && junk(b"[]") && junk(br#"[{"id":1,"result":{}}]"#));
    // 200 and 10,000 levels, closed or cut off.
    for depth in [200, 10_000] {
        for object in [false, true] {
            for closed in [false, true] {
                let line = format!(
                    "{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}}",
                    nested(depth, object, closed)
                );
                assert!(unusable(line.as_bytes()), "{depth} {object} {closed}");
                assert!(unusable(nested(depth, object, closed).as_bytes()));
            }
        }
    }
    // A string id naming one of our ids; ids toolboxd never sends.
    let id = |line: &[u8]| match parse(line) {
        Ok(Incoming::Response { id, .. }) => id,
        other => panic!("{other:?}"),
    };
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":"7","result":{}}"#), Some(7));
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":18446744073709551615,"result":{}}"#),
        Some(u64::MAX)
    );
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":18446744073709551616,"result":{}}"#),
        None
    );
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":"18446744073709551616","result":{}}"#),
        None
    );
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":-7,"result":{}}"#), None);
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":7.5,"result":{}}"#), None);
    assert_eq!(id(br#"{"jsonrpc":"2.0","id":[7],"result":{}}"#), None);
    // An error code past i64 reads as 0, a message that is not a string as "".
    match parse(br#"{"jsonrpc":"2.0","id":1,"error":{"code":9223372036854775808,"message":[1]}}"#) {
        Ok(Incoming::Response { result: Err(e), .. }) => {
            assert_eq!((e.code, e.message), (0, String::new()))
        }
        other => panic!("{other:?}"),
    }
    // Not UTF-8, NUL, BOM, lone surrogates, numbers past f64: junk.
    for line in [
        &b"\xff\xfe{}"[..],
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xc0\x80\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":\"\xed\xa0\x80\"}",
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\0",
        b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}",
        br#"{"jsonrpc":"2.0","id":1,"result":"\ud800"}"#,
        br#"{"jsonrpc":"2.0","id":1,"result":1e999999}"#,
        b"",
        b"\n",
    ] {
        assert!(junk(line), "{:?}", String::from_utf8_lossy(line));
    }
    // A key given twice: the last one counts (a map), and the line is read.
    assert_eq!(
        id(br#"{"jsonrpc":"2.0","id":1,"id":2,"result":{}}"#),
        Some(2)
    );
    // Found by the properties above: DEL and C1 controls, which JSON leaves
    // as they are, are escaped in what a tools page reports.
    let (specs, _) = parse_tools_page(&json!({"tools": [{"x": "\u{7f}\u{85}\u{9b}"}]}));
    assert_eq!(
        specs,
        [Err(
            r#"a listed tool has no name: {"x":"\u007f\u0085\u009b"}"#.to_owned()
        )]
    );
    // A tools page with a hostile name reports it on one line.
    let (specs, _) = parse_tools_page(&json!({"tools": [{"name": "a\nb"}, {"x": "\u{0}\n"}]}));
    for spec in specs {
        assert_one_line(&spec.unwrap_err());
    }
}
