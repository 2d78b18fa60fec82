//! Manifest parsing and validation, file by file and knob by knob.

use super::*;

fn parse(text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(Path::new("/tmp/m.toml"), text)
}

#[test]
fn defaults_fill_everything_optional() {
    let m = parse("id = \"math\"\ncommand = \"sh\"\n").unwrap();
    assert_eq!(m.id, "math");
    assert!(m.enabled && !m.env_clear && m.protocol.is_none() && !m.audit_arguments);
    assert_eq!(m.restart, Restart::default());
    assert_eq!(m.limits, Limits::default());
    assert_eq!(m.cwd, Path::new("/tmp"));
    assert!(m.program.ends_with("sh"));
}

#[test]
fn audit_arguments_is_a_boolean() {
    let m = parse("id = \"math\"\ncommand = \"sh\"\naudit_arguments = true\n").unwrap();
    assert!(m.audit_arguments);
    let e = parse("id = \"math\"\ncommand = \"sh\"\naudit_arguments = \"yes\"\n").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
}

#[test]
fn unknown_key_names_key_and_line() {
    let e = parse("id = \"a\"\ncommand = \"sh\"\ncomand = \"x\"\n").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("comand"), "{e}");
    let e = parse("id = \"a\"\ncommand = \"sh\"\n[limits]\ncall_timeout = 3\n").unwrap_err();
    assert_eq!(e.line, Some(4));
    assert!(
        e.to_string().starts_with("/tmp/m.toml:4: unknown field"),
        "{e}"
    );
}

#[test]
fn bad_ids_are_rejected_with_the_rule() {
    for id in ["a.b", "a:b", "", "a b", "ü"] {
        let e = parse(&format!("command = \"sh\"\nid = {id:?}\n")).unwrap_err();
        assert_eq!(e.line, Some(2), "{id}");
        assert!(e.message.contains("never ':' or '.'"), "{e}");
    }
}

#[test]
fn missing_executable_is_named() {
    let e = parse("id = \"a\"\ncommand = \"no-such-binary-xyz\"\n").unwrap_err();
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("not found in PATH"), "{e}");
    let e = parse("id = \"a\"\ncommand = \"./nope.sh\"\n").unwrap_err();
    assert!(e.message.contains("does not exist"), "{e}");
}

#[test]
fn every_knob_is_bounded_on_both_sides() {
    for (key, min, max) in KNOB_RANGES {
        let table = if [
            "call_timeout_s",
            "max_concurrent_calls",
            "max_queued_calls",
            "max_argument_bytes",
            "probe_interval_s",
            "probe_timeout_s",
            "drain_timeout_s",
            "max_message_bytes",
            "max_timeouts_in_a_row",
        ]
        .contains(&key)
        {
            "limits"
        } else {
            "restart"
        };
        // backoff_max_ms may not be below backoff_initial_ms: keep them apart.
        let extra = if key == "backoff_initial_ms" {
            "backoff_max_ms = 3600000\n"
        } else {
            ""
        };
        let text =
            |v: u64| format!("id = \"a\"\ncommand = \"sh\"\n[{table}]\n{extra}{key} = {v}\n");
        let line = if extra.is_empty() { 4 } else { 5 };
        parse(&text(max)).unwrap_or_else(|e| panic!("{key} = {max}: {e}"));
        if key != "backoff_max_ms" {
            parse(&text(min)).unwrap_or_else(|e| panic!("{key} = {min}: {e}"));
        }
        let e = parse(&text(max + 1)).unwrap_err();
        assert_eq!(e.line, Some(line), "{key}: {e}");
        assert_eq!(
            e.message,
            format!("{key} = {} must be between {min} and {max}", max + 1),
            "{key}"
        );
        // The largest TOML integer: refused at its line (by range, or by
        // type for the narrower knobs), never accepted.
        let e = parse(&text(i64::MAX as u64)).unwrap_err();
        assert_eq!(e.line, Some(line), "{key}: {e}");
        if min > 0 {
            let e = parse(&text(min - 1)).unwrap_err();
            assert!(e.message.contains(key), "{key}: {e}");
        }
    }
}

#[test]
fn non_regular_and_huge_manifests_are_reported_not_read() {
    let dir = std::env::temp_dir().join(format!("toolboxd-manifest-kinds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("dir.toml")).unwrap();
    nix::unistd::mkfifo(&dir.join("fifo.toml"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.toml")).unwrap();
    std::fs::write(
        dir.join("huge.toml"),
        vec![b'#'; MAX_MANIFEST_BYTES as usize + 1],
    )
    .unwrap();
    std::fs::write(dir.join("good.toml"), "id = \"good\"\ncommand = \"sh\"\n").unwrap();
    let set = load_dirs(std::slice::from_ref(&dir));
    assert_eq!(set.manifests.len(), 1);
    let reported: Vec<String> = set.errors.iter().map(|e| e.to_string()).collect();
    for (file, what) in [
        ("dir.toml", "is a directory"),
        ("fifo.toml", "is a FIFO"),
        ("zero.toml", "is a device"),
        ("huge.toml", "is larger than 1048576 bytes"),
    ] {
        assert!(
            reported
                .iter()
                .any(|r| r.contains(file) && r.contains(what)),
            "{file}: {reported:?}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn boundaries_of_ids_timeouts_sizes_and_executables() {
    assert_eq!(
        parse("id = \"a_b-9\"\ncommand = \"sh\"\n").unwrap().id,
        "a_b-9"
    );
    let m = parse("id = \"a\"\ncommand = \"sh\"\n[limits]\ncall_timeout_s = 10\n[limits.tool_timeouts]\nt = 10\n")
        .unwrap();
    assert_eq!(m.limits.tool_timeouts["t"], 10);
    let dir = std::env::temp_dir().join(format!("toolboxd-manifest-edges-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("adir")).unwrap();
    // Exactly the largest size is read.
    let head = "id = \"big\"\ncommand = \"sh\"\n";
    let text = format!(
        "{head}{}",
        "#".repeat(MAX_MANIFEST_BYTES as usize - head.len())
    );
    std::fs::write(dir.join("big.toml"), text).unwrap();
    assert_eq!(Manifest::load(&dir.join("big.toml")).unwrap().id, "big");
    // A command that is a directory, or not executable, is named.
    std::fs::write(dir.join("script.sh"), "#!/bin/sh\n").unwrap();
    for command in ["./adir", "./script.sh"] {
        let text = format!("id = \"x\"\ncommand = \"{command}\"\n");
        std::fs::write(dir.join("x.toml"), text).unwrap();
        let e = Manifest::load(&dir.join("x.toml")).unwrap_err();
        assert_eq!(e.line, Some(2), "{command}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tool_timeouts_may_only_shorten_the_deadline() {
    let ok = parse("id = \"a\"\ncommand = \"sh\"\n[limits]\ncall_timeout_s = 10\n[limits.tool_timeouts]\nslow = 5\n")
        .unwrap();
    assert_eq!(ok.limits.tool_timeouts["slow"], 5);
    let e = parse("id = \"a\"\ncommand = \"sh\"\n[limits]\ncall_timeout_s = 10\n[limits.tool_timeouts]\nslow = 50\n")
        .unwrap_err();
    assert!(e.message.contains("not lengthen"), "{e}");
}

#[test]
fn protocol_pin_is_checked() {
    assert_eq!(
        parse("id = \"a\"\ncommand = \"sh\"\nprotocol = \"2025-06-18\"\n")
            .unwrap()
            .protocol
            .as_deref(),
        Some("2025-06-18")
    );
    assert!(parse("id = \"a\"\ncommand = \"sh\"\nprotocol = \"1999\"\n").is_err());
}

#[test]
fn knobs_are_checked() {
    let e =
        parse("id = \"a\"\ncommand = \"sh\"\n[limits]\nmax_concurrent_calls = 0\n").unwrap_err();
    assert_eq!(e.line, Some(4));
    let e = parse("id = \"a\"\ncommand = \"sh\"\n[restart]\npolicy = \"sometimes\"\n").unwrap_err();
    assert!(e.message.contains("sometimes"), "{e}");
}

#[test]
fn duplicate_ids_across_files_name_both() {
    let dir = std::env::temp_dir().join(format!("toolboxd-dup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.toml"), "id = \"x\"\ncommand = \"sh\"\n").unwrap();
    std::fs::write(dir.join("b.toml"), "id = \"x\"\ncommand = \"sh\"\n").unwrap();
    let set = load_dirs(std::slice::from_ref(&dir));
    assert_eq!(set.manifests.len(), 1);
    assert_eq!(set.errors.len(), 1);
    let msg = set.errors[0].to_string();
    assert!(msg.contains("b.toml:1") && msg.contains("a.toml"), "{msg}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn prewarm_topics_must_come_before_a_call() {
    let with = |topic: &str| {
        parse(&format!(
            "id = \"a\"\ncommand = \"sh\"\n[start]\nprewarm_on = [{topic:?}]\n"
        ))
    };
    assert!(with("recognizer_loop:wakeword").is_ok());
    // Topics toolboxd answers itself, and answers, never prewarm.
    for topic in [
        "ovos.tools.invoke",
        "ovos.persona.tools.math.call",
        "mycroft.stop",
        "ovos.persona.tools.discover.response",
        "speak.response",
    ] {
        let e = with(topic).unwrap_err();
        assert!(e.message.contains("never starts a toolbox"), "{topic}: {e}");
    }
}

#[test]
fn a_missing_command_is_said_relative_to_the_manifest_only_when_it_is() {
    let e = parse("id = \"a\"\ncommand = \"/nowhere/bin/tool\"\n").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("/nowhere/bin/tool does not exist"), "{text}");
    assert!(!text.contains("relative to the manifest"), "{text}");
    let e = parse("id = \"a\"\ncommand = \"bin/tool\"\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("relative to the manifest's directory"),
        "{e}"
    );
}

#[test]
fn annotations_set_or_override_a_tools_and_are_checked() {
    let m = parse(
        "id = \"a\"\ncommand = \"sh\"\n[annotations.unlock]\ntitle = \"Unlock the door\"\n\
         destructiveHint = true\n",
    )
    .unwrap();
    let mut specs = vec![
        crate::mcp::ToolSpec {
            name: "unlock".into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: Some(serde_json::json!({"destructiveHint": false, "openWorldHint": true})),
        },
        crate::mcp::ToolSpec {
            name: "look".into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            annotations: None,
        },
    ];
    m.annotations.apply(&mut specs);
    assert_eq!(
        specs[0].annotations,
        Some(
            serde_json::json!({"title": "Unlock the door", "destructiveHint": true,
                                "openWorldHint": true})
        )
    );
    assert_eq!(specs[1].annotations, None);
    let e =
        parse("id = \"a\"\ncommand = \"sh\"\n[annotations.x]\ndestructive = true\n").unwrap_err();
    assert!(e.to_string().contains("unknown field"), "{e}");
    let long = "t".repeat(300);
    let e = parse(&format!(
        "id = \"a\"\ncommand = \"sh\"\n[annotations.x]\ntitle = \"{long}\"\n"
    ))
    .unwrap_err();
    assert!(e.to_string().contains("at most 256"), "{e}");
}

#[test]
fn every_wrong_value_of_a_manifest_is_named_not_only_the_first() {
    let path = Path::new("/tmp/m.toml");
    // Two values of the wrong type and an unknown key: each its own line.
    let text = "id = \"a\"\ncommand = \"sh\"\ninstances = \"two\"\nenabeld = true\n\
                [limits]\ncall_timeout_s = \"soon\"\n";
    let problems = Manifest::parse_all(path, text).unwrap_err();
    let lines: Vec<Option<usize>> = problems.iter().map(|p| p.line).collect();
    assert_eq!(lines, [Some(3), Some(4), Some(6)], "{problems:?}");
    assert!(problems[1].message.contains("enabeld"), "{problems:?}");
    // Values in range of their type but wrong: every one, with its line.
    let text = "id = \"a.b\"\ncommand = \"no-such-binary-xyz\"\nprotocol = \"1999\"\n\
                [limits]\ncall_timeout_s = 0\nprobe_interval_s = 0\n";
    let problems = Manifest::parse_all(path, text).unwrap_err();
    let lines: Vec<Option<usize>> = problems.iter().map(|p| p.line).collect();
    assert_eq!(
        lines,
        [Some(1), Some(2), Some(3), Some(5), Some(6)],
        "{problems:?}"
    );
    // The first problem is what `parse` says.
    assert_eq!(
        parse(text).unwrap_err(),
        problems.into_iter().next().unwrap()
    );
    // A required key given a wrong value is not also "missing".
    let problems = Manifest::parse_all(path, "id = 3\ncommand = \"sh\"\n").unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    // Bad TOML stops the reading: what follows cannot be read.
    let problems = Manifest::parse_all(path, "id = \"a\"\ncommand = [\"sh\"\nx = 1\n").unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
}
