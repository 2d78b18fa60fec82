//! Part 3, the manifest parser (`Manifest::parse`).

use super::*;

/// Where the generated manifests say they were read from.
fn manifest_path() -> PathBuf {
    std::env::temp_dir().join("fuzz.toml")
}

/// A TOML basic string holding `s` exactly.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

const TOML_PIECES: &[&str] = &[
    "id",
    "command",
    "args",
    "env",
    "cwd",
    "protocol",
    "instances",
    "enabled",
    "env_clear",
    "policy",
    "call_timeout_s",
    "tool_timeouts",
    "[limits]",
    "[restart]",
    "[limits.tool_timeouts]",
    "[[args]]",
    "[[limits]]",
    " = ",
    "=",
    "\"sh\"",
    "\"a.b\"",
    "\"a\\nb\"",
    "\"\\u0000\"",
    "'lit'",
    "'''",
    "\"\"\"",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "9223372036854775807",
    "18446744073709551616",
    "-1",
    "0",
    "1e400",
    "inf",
    "nan",
    "true",
    "1979-05-27T07:32:00Z",
    "\n",
    "\r\n",
    "\r",
    "\0",
    "\u{feff}",
    "#",
    " ",
    "\t",
    "\u{7f}",
    "\u{202e}",
    "\"",
    "\\",
    "x",
];

/// What a generated valid manifest says.
#[derive(Debug, Clone)]
struct Spec {
    id: String,
    command: &'static str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    env_clear: bool,
    enabled: Option<bool>,
    instances: Option<usize>,
    protocol: Option<&'static str>,
    policy: Option<(&'static str, RestartPolicy)>,
    /// One value (or the default) per entry of KNOB_RANGES.
    knobs: Vec<Option<u64>>,
    tool_timeouts: BTreeMap<String, u64>,
    /// The order the top-level keys are written in.
    order: Vec<usize>,
}

const LIMIT_KNOBS: usize = 9;

fn arb_spec() -> impl Strategy<Value = Spec> {
    let knobs = KNOB_RANGES
        .iter()
        .map(|&(_, min, max)| prop::option::of(min..=max))
        .collect::<Vec<_>>();
    (
        "[A-Za-z0-9_-]{1,40}",
        select(&["sh", "/bin/sh", "cat"][..]),
        prop::collection::vec(arb_text(), 0..5),
        prop::collection::btree_map("[a-z][a-z0-9_]{0,7}", arb_text(), 0..4),
        any::<bool>(),
        prop::option::of(any::<bool>()),
        prop::option::of(1usize..=64),
        prop::option::of(select(
            &[
                "auto",
                "2026-07-28",
                "2025-11-25",
                "2025-06-18",
                "2025-03-26",
                "2024-11-05",
            ][..],
        )),
        prop::option::of(select(
            &[
                ("always", RestartPolicy::Always),
                ("on-failure", RestartPolicy::OnFailure),
                ("never", RestartPolicy::Never),
            ][..],
        )),
        knobs,
        prop::collection::btree_map(arb_text(), any::<u64>(), 0..4),
        Just((0..9).collect::<Vec<usize>>()).prop_shuffle(),
    )
        .prop_map(
            |(
                id,
                command,
                args,
                mut env,
                env_clear,
                enabled,
                instances,
                protocol,
                policy,
                mut knobs,
                timeouts,
                order,
            )| {
                if env_clear && !command.contains('/') {
                    env.insert("PATH".to_owned(), "/usr/bin:/bin".to_owned());
                }
                // backoff_max_ms may not be below backoff_initial_ms.
                let value = |knobs: &[Option<u64>], i: usize| knobs[i].unwrap_or(default_knob(i));
                let (initial, max) = (9, 10);
                if value(&knobs, max) < value(&knobs, initial) {
                    knobs[max] = Some(value(&knobs, initial));
                }
                let call_timeout = value(&knobs, 0);
                let tool_timeouts = timeouts
                    .into_iter()
                    .map(|(tool, secs)| (tool, 1 + secs % call_timeout))
                    .collect();
                Spec {
                    id,
                    command,
                    args,
                    env,
                    env_clear,
                    enabled,
                    instances,
                    protocol,
                    policy,
                    knobs,
                    tool_timeouts,
                    order,
                }
            },
        )
}

/// The default of knob `i` of KNOB_RANGES.
fn default_knob(i: usize) -> u64 {
    knob_values(&Restart::default(), &Limits::default())[i]
}

impl Spec {
    fn text(&self) -> String {
        let mut top: Vec<Option<String>> = vec![
            Some(format!("id = {}", toml_string(&self.id))),
            Some(format!("command = {}", toml_string(self.command))),
            (!self.args.is_empty()).then(|| {
                let args: Vec<String> = self.args.iter().map(|a| toml_string(a)).collect();
                format!("args = [{}]", args.join(", "))
            }),
            (!self.env.is_empty()).then(|| {
                let env: Vec<String> = self
                    .env
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", toml_string(v)))
                    .collect();
                format!("env = {{ {} }}", env.join(", "))
            }),
            self.env_clear.then(|| "env_clear = true".to_owned()),
            self.enabled.map(|e| format!("enabled = {e}")),
            self.instances.map(|n| format!("instances = {n}")),
            self.protocol
                .map(|p| format!("protocol = {}", toml_string(p))),
            Some("# a comment".to_owned()),
        ];
        let mut text = String::new();
        for &i in &self.order {
            if let Some(line) = top[i].take() {
                text.push_str(&line);
                text.push('\n');
            }
        }
        text.push_str("\n[limits]\n");
        for (i, &(key, _, _)) in KNOB_RANGES.iter().enumerate() {
            if i == LIMIT_KNOBS {
                text.push_str("\n[restart]\n");
                if let Some((policy, _)) = self.policy {
                    text.push_str(&format!("policy = \"{policy}\"\n"));
                }
            }
            if let Some(value) = self.knobs[i] {
                text.push_str(&format!("{key} = {value}\n"));
            }
        }
        if !self.tool_timeouts.is_empty() {
            text.push_str("\n[limits.tool_timeouts]\n");
            for (tool, secs) in &self.tool_timeouts {
                text.push_str(&format!("{} = {secs}\n", toml_string(tool)));
            }
        }
        text
    }
}

fn hostile_toml() -> impl Strategy<Value = String> {
    hostile_text(TOML_PIECES, arb_spec().prop_map(|spec| spec.text()).boxed())
}

/// Parses `text` as a manifest, and checks the error's shape if it is one.
fn parse_manifest(text: &str) -> Result<Manifest, toolboxd::manifest::ManifestError> {
    let parsed = Manifest::parse(&manifest_path(), text);
    if let Err(e) = &parsed {
        assert_one_line(&e.to_string());
        assert_eq!(e.path, manifest_path());
        if let Some(line) = e.line {
            assert!(
                (1..=text.split('\n').count()).contains(&line),
                "line {line} of {text:?}"
            );
        }
    }
    parsed
}

proptest! {
    #![proptest_config(config())]

    /// Any text is a manifest or an error naming the file, a line of it (if
    /// any) and the fault, on one line.
    #[test]
    fn manifest_parse_is_total(text in hostile_toml()) {
        if let Ok(manifest) = parse_manifest(&text) {
            prop_assert!(valid_id(&manifest.id));
            prop_assert!((1..=64).contains(&manifest.instances));
        }
    }

    /// A valid manifest reads as what it says, every default filled in.
    #[test]
    fn manifest_valid_text_reads_as_written(spec in arb_spec()) {
        let text = spec.text();
        let manifest = parse_manifest(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&manifest.id, &spec.id);
        prop_assert!(manifest.program.ends_with(spec.command.trim_start_matches('/')));
        prop_assert_eq!(&manifest.args, &spec.args);
        prop_assert_eq!(&manifest.env, &spec.env);
        prop_assert_eq!(manifest.env_clear, spec.env_clear);
        prop_assert_eq!(manifest.enabled, spec.enabled.unwrap_or(true));
        prop_assert_eq!(manifest.instances, spec.instances.unwrap_or(1));
        prop_assert_eq!(manifest.protocol.as_deref(), spec.protocol.filter(|p| *p != "auto"));
        prop_assert_eq!(manifest.restart.policy, spec.policy.map_or(RestartPolicy::Always, |p| p.1));
        let expected: Vec<u64> = (0..KNOB_RANGES.len()).map(|i| spec.knobs[i].unwrap_or(default_knob(i))).collect();
        prop_assert_eq!(knob_values(&manifest.restart, &manifest.limits).to_vec(), expected);
        prop_assert_eq!(&manifest.limits.tool_timeouts, &spec.tool_timeouts);
        let path = manifest_path();
        prop_assert_eq!(manifest.cwd.as_path(), path.parent().unwrap());
    }

    /// An id outside `[A-Za-z0-9_-]+` is refused at its line with the rule.
    #[test]
    fn manifest_bad_ids_are_refused_at_their_line(
        spec in arb_spec(),
        id in arb_text().prop_filter("not a toolbox_id", |id| !valid_id(id)),
    ) {
        let mut spec = spec;
        spec.id = id;
        let text = spec.text();
        let e = parse_manifest(&text).expect_err("a bad id");
        let line = text.lines().position(|l| l.starts_with("id = ")).unwrap() + 1;
        prop_assert_eq!(e.line, Some(line));
        prop_assert!(e.message.contains("never ':' or '.'"), "{}", e);
    }

    /// A knob past its range, up to the largest TOML integer, is refused at
    /// its line; so is a tool deadline longer than the call's.
    #[test]
    fn manifest_knobs_out_of_range_are_refused_at_their_line(
        spec in arb_spec(),
        knob in 0..KNOB_RANGES.len(),
        above: bool,
        by in 1u64..=i64::MAX as u64,
        tool in arb_text(),
    ) {
        let (key, min, max) = KNOB_RANGES[knob];
        let value = if above { max.saturating_add(by).min(i64::MAX as u64) } else if min > 0 { min - 1 - (by - 1) % min } else { return Ok(()) };
        let mut spec = spec;
        let valid = spec.knobs[knob];
        spec.knobs[knob] = Some(value);
        let text = spec.text();
        let e = parse_manifest(&text).expect_err("a knob out of range");
        let line = text.lines().position(|l| l.starts_with(&format!("{key} = "))).unwrap() + 1;
        prop_assert_eq!(e.line, Some(line), "{}", e);
        // Past its type (a u32 knob), TOML's own words name the type.
        prop_assert!(e.message.contains(key) || e.message.contains("expected u32"), "{}", e);

        spec.knobs[knob] = valid;
        let call_timeout = spec.knobs[0].unwrap_or(default_knob(0));
        spec.tool_timeouts = BTreeMap::from([(tool, call_timeout + 1 + by % 1000)]);
        let e = parse_manifest(&spec.text()).expect_err("a tool deadline past the call's");
        prop_assert!(e.message.contains("not lengthen"), "{}", e);
    }
}

#[test]
fn manifest_hostile_corpus() {
    let head = "id = \"math\"\ncommand = \"sh\"\n";
    // The largest TOML integer in a knob: refused at its line.
    let e = parse_manifest(&format!(
        "{head}[limits]\nprobe_interval_s = 9223372036854775807\n"
    ))
    .unwrap_err();
    assert_eq!(e.line, Some(4));
    assert_eq!(
        e.message,
        "probe_interval_s = 9223372036854775807 must be between 1 and 3600"
    );
    // Past it, and below zero: refused by TOML or the knob's type.
    for value in [
        "9223372036854775808",
        "18446744073709551616",
        "-1",
        "1e400",
        "inf",
        "nan",
    ] {
        let e =
            parse_manifest(&format!("{head}[limits]\nprobe_interval_s = {value}\n")).unwrap_err();
        assert_eq!(e.line, Some(4), "{value}: {e}");
    }
    // A huge table array: refused, quickly.
    for key in ["args", "limits", "x"] {
        let text = format!("{head}{}", format!("[[{key}]]\na = 1\n").repeat(50_000));
        let started = std::time::Instant::now();
        parse_manifest(&text).unwrap_err();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{key}"
        );
    }
    // TOML bombs: inline tables and arrays nested deep, in a file under the
    // size limit.
    for depth in [200, 10_000, 100_000] {
        for (open, close) in [("{a = ", "}"), ("[", "]")] {
            let bomb = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let e = parse_manifest(&format!("{head}x = {bomb}\n")).unwrap_err();
            assert_eq!(e.line, Some(3), "{depth} {open}: {e}");
            parse_manifest(&format!("{head}[limits.tool_timeouts]\nt = {bomb}\n")).unwrap_err();
            parse_manifest(&format!("{head}x = {}\n", open.repeat(depth))).unwrap_err();
        }
    }
    // Ids that would break a topic or a log line.
    for id in ["a.b", "a:b", "a\nb", "a\u{0}b", "a\u{202e}b", "", " a"] {
        let e =
            parse_manifest(&format!("command = \"sh\"\nid = {}\n", toml_string(id))).unwrap_err();
        assert_eq!(e.line, Some(2), "{id:?}");
        assert!(e.message.contains("never ':' or '.'"), "{e}");
    }
    // Found by the properties above: what an error quotes from the file (an
    // unknown key, a value, a path) is escaped, so the error stays one line.
    let e = parse_manifest(&format!("{head}\"a\\nb\" = 1\n")).unwrap_err();
    assert!(
        e.to_string().starts_with(&format!(
            "{}:3: unknown field `a\\nb`, expected one of",
            manifest_path().display()
        )),
        "{e}"
    );
    let e = parse_manifest(&format!(
        "{head}[limits.tool_timeouts]\n\"x\\u001b[2J\" = 0\n"
    ))
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("tool_timeouts.x\\u{1b}[2J = 0 must be between 1"),
        "{e}"
    );
    let e = parse_manifest("id = \"a\"\ncommand = \"./a\\nb\"\n").unwrap_err();
    assert!(e.to_string().contains("/a\\nb does not exist"), "{e}");
    // A file name with a newline (load_dirs reads any *.toml) is escaped too.
    let e = toolboxd::manifest::ManifestError {
        path: PathBuf::from("dir/a\nb.toml"),
        line: Some(1),
        message: "x\u{1b}[2J".to_owned(),
    };
    assert_eq!(e.to_string(), "dir/a\\nb.toml:1: x\\u{1b}[2J");
    // Raw control characters in a key or a value, and a BOM.
    for text in [
        format!("{head}\"a\nb\" = 1\n"),
        format!("{head}\"a\\nb\" = 1\n"),
        format!("{head}[restart]\npolicy = \"a\\nb\"\n"),
        format!("{head}[limits.tool_timeouts]\n\"a\\nb\" = 0\n"),
        format!("{head}[limits.tool_timeouts]\n\"a\\u001b[2Jb\" = 99999999\n"),
        "id = \"a\"\ncommand = \"./a\\nb\"\n".to_owned(),
        "id = \"a\"\ncommand = \"a\\nb\"\n".to_owned(),
        "id = \"a\"\ncommand = \"sh\"\ncwd = \"a\\nb\"\n".to_owned(),
        format!("\u{feff}{head}"),
        format!("{head}\0"),
    ] {
        // parse_manifest checks that the error reads as one line.
        let _ = parse_manifest(&text);
    }
}

/// The paths used above exist (the manifest's directory) so that a failure
/// is the decoder's, not the machine's.
#[test]
fn the_manifest_directory_exists() {
    assert!(Path::new(&manifest_path()).parent().unwrap().is_dir());
}
