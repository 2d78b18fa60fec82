//! The scenarios, in the order they run (12 and 13 after 2); `--only` picks some by
//! number (4 needs 1 and 3: it compares their bare echo loads).

use super::*;

pub(crate) async fn bench(b: &mut Bench) {
    let py = venv_python();
    let examples = root().join("examples");
    let compiled = Variant {
        label: "compiled child (Rust)",
        command: echo_child(),
        args: vec![],
        tools: 4,
    };
    let python_child = Variant {
        label: "Python child (examples/python)",
        command: py.clone(),
        args: vec![examples
            .join("python/math_toolbox.py")
            .display()
            .to_string()],
        tools: 4,
    };
    let plugin_child = Variant {
        label: "the plugin, as a child (opm_host.py)",
        command: py.clone(),
        args: vec![
            examples.join("python/opm_host.py").display().to_string(),
            "test-math-tools".into(),
        ],
        tools: 2,
    };
    let home = b.home.clone();

    // 1 and 4 (embedded half): toolboxd -> compiled child vs bare echo,
    // embedded bus. Each side is measured alone on the bus: every client gets
    // every frame, so a bystander (the other side, idle) would spend CPU on
    // the measured side's traffic, on a machine with two cores.
    let bus = embedded_bus();
    let mut embedded_echo = Vec::new();
    let mut compiled_c8 = None;
    if b.runs("1") || b.runs("4") {
        for conns in [1, 8] {
            let echo = echo_responder(&bus.url);
            let e = b
                .load(
                    "1",
                    "bare echo responder (Rust)",
                    &bus,
                    Call::Echo,
                    conns,
                    echo.pid(),
                )
                .await;
            drop(echo);
            let relay = bare_relay(&bus.url, &compiled.command);
            let r = b
                .load(
                    "1",
                    "bare relay → compiled child (Rust; no validation, no sandbox)",
                    &bus,
                    Call::Add,
                    conns,
                    relay.pid(),
                )
                .await;
            drop(relay);
            let d = b.daemon(&bus.url, "compiled", &compiled, 1, "");
            let t = b
                .load(
                    "1",
                    "toolboxd → compiled child",
                    &bus,
                    Call::Add,
                    conns,
                    d.pid(),
                )
                .await;
            drop(d);
            b.rate_row(
            &format!("1-c{conns}-rate"),
            &format!("C={conns}: calls/s, toolboxd → compiled child ÷ bare echo responder (both Rust), embedded bus"),
            &t,
            &e,
            // C=8: the edge-device target (0.8); C=1 keeps 0.5 (the 1.0×
            // set beside it was measured with a slower client than ours).
            if conns == 8 {
                Target::at_least(0.8, "≥ 0.80")
            } else {
                Target::at_least(0.5, "≥ 0.50")
            },
        );
            // The floor of a service that runs its tools in a child.
            b.rate_row(
                &format!("1-c{conns}-relay"),
                &format!("C={conns}: calls/s, toolboxd → compiled child ÷ bare relay → the same child, embedded bus"),
                &t,
                &r,
                Target::at_least(0.95, "≥ 0.95"),
            );
            b.p50_row(
                &format!("1-c{conns}-p50"),
                &format!("C={conns}: p50, toolboxd → compiled child ÷ bare echo responder"),
                &t,
                &e,
                Target::at_most(2.0, "≤ 2×"),
            );
            embedded_echo.push(e);
            compiled_c8 = Some(t);
        }
    }
    if b.runs("2") {
        // 2: toolboxd with Python children vs the Python service (its plugin in process), C=8.
        let mut s2 = Vec::new();
        for (tag, variant) in [("python", &python_child), ("plugin", &plugin_child)] {
            let d = b.daemon(&bus.url, tag, variant, 1, "");
            let service = format!("toolboxd → {}", variant.label);
            s2.push(b.load("2", &service, &bus, Call::Add, 8, d.pid()).await);
        }
        let svc = python_service(&bus.url, &home, 1);
        let p = b
            .load(
                "2",
                "Python service (the plugin in process)",
                &bus,
                Call::Add,
                8,
                svc.pid(),
            )
            .await;
        drop(svc);
        b.rate_row(
        "2-rate",
        "C=8: calls/s, toolboxd → Python child ÷ the Python service (Python plugin), embedded bus",
        &s2[0],
        &p,
        Target::at_least(3.0, "≥ 3×"),
    );
        b.rate_row(
            "2-rate-plugin",
            "the same, toolboxd → the same plugin run as a child (opm_host.py)",
            &s2[1],
            &p,
            None,
        );
        if let Some(c8) = &compiled_c8 {
            b.rate_row(
                "2-rate-compiled",
                "the same, toolboxd → compiled child (scenario 1, C=8)",
                c8,
                &p,
                None,
            );
        }
        let tree = |l: &LoadRecord| l.cpu_per_call_us.map(|s| s.tree);
        let own = |l: &LoadRecord| l.cpu_per_call_us.map(|s| s.without_children);
        b.cpu_row(
        "2-cpu",
        "C=8: CPU per call, whole tree (toolboxd + keeper + Python child) ÷ the Python service's process",
        tree(&s2[0]),
        tree(&p),
    );
        b.cpu_row(
            "2-cpu-plugin",
            "the same, with the plugin as a child (opm_host.py)",
            tree(&s2[1]),
            tree(&p),
        );
        b.cpu_row(
            "2-cpu-own",
            "C=8: CPU per call without children (toolboxd + keeper) ÷ the Python service's process",
            own(&s2[0]),
            tree(&p),
        );
    }
    drop(bus);
    if b.runs("12") {
        // 12: scenario 1 on toolboxd's own embedded bus (`run
        // --embedded-bus`): the daemon is the bus, the echo responder its
        // bystander peer there, as on a device where toolboxd is the bus.
        // (Run here, while no other bus is up.)
        let dir = tempdir("own-bus");
        compiled.manifest(&dir, "box", "");
        let own = daemon_embedding(&dir);
        for conns in [1, 8] {
            let echo = echo_responder(&own.url);
            let what = "bare echo responder (Rust), toolboxd idle";
            let e = b
                .load("12", what, &own, Call::Echo, conns, echo.pid())
                .await;
            drop(echo);
            let pid = own.proc.pid();
            let what = "toolboxd → compiled child";
            let t = b.load("12", what, &own, Call::Add, conns, pid).await;
            b.rate_row(
                &format!("12-c{conns}-rate"),
                &format!("C={conns}: calls/s, toolboxd → compiled child ÷ bare echo responder, both on toolboxd's own embedded bus (`run --embedded-bus`)"),
                &t,
                &e,
                None,
            );
        }
    }
    if b.runs("13") {
        // 13: a call through the MCP face (`toolboxd mcp` over stdio, a client
        // of the bus) against the same call made on the bus, C=1, on
        // toolboxd's own embedded bus: what the face and its bus hop add.
        let dir = tempdir("mcp-face");
        compiled.manifest(&dir, "box", "");
        let own = daemon_embedding(&dir);
        let pid = own.proc.pid();
        let on_bus = b
            .load(
                "13",
                "bus client → toolboxd → compiled child",
                &own,
                Call::Add,
                1,
                pid,
            )
            .await;
        let r = mcp_load(&own.url, 1, pid, None).await;
        let what = "MCP client → toolboxd mcp → bus → toolboxd → compiled child";
        let through_mcp = b.record("13", what, &own, 1, pid, r);
        b.rate_row(
            "13-c1-rate",
            "C=1: calls/s, through the MCP face ÷ the same call on the bus (toolboxd's own bus)",
            &through_mcp,
            &on_bus,
            None,
        );
        b.p50_row(
            "13-c1-p50",
            "C=1: p50, through the MCP face ÷ the same call on the bus",
            &through_mcp,
            &on_bus,
            None,
        );
    }
    if b.runs("3") || b.runs("4") {
        let pybus = python_bus(&home);
        let echo = echo_responder(&pybus.url);
        let mut python_echo = Vec::new();
        for conns in [1, 8] {
            python_echo.push(
                b.load(
                    "4",
                    "bare echo responder (Rust)",
                    &pybus,
                    Call::Echo,
                    conns,
                    echo.pid(),
                )
                .await,
            );
        }
        drop(echo);
        let svc = python_service(&pybus.url, &home, 1);
        let p = b
            .load(
                "3",
                "Python service (the plugin in process)",
                &pybus,
                Call::Add,
                1,
                svc.pid(),
            )
            .await;
        drop(svc);
        let mut s3 = Vec::new();
        for (tag, variant) in [
            ("pybus-python", &python_child),
            ("pybus-plugin", &plugin_child),
            ("pybus-compiled", &compiled),
        ] {
            let d = b.daemon(&pybus.url, tag, variant, 1, "");
            let service = format!("toolboxd → {}", variant.label);
            s3.push(b.load("3", &service, &pybus, Call::Add, 1, d.pid()).await);
        }
        b.p50_row(
            "3-p50",
            "Python bus, C=1: p50, the Python service ÷ toolboxd → Python child",
            &p,
            &s3[0],
            Target::at_least(40.0, "≥ 40×"),
        );
        b.p50_row(
            "3-p50-plugin",
            "the same, toolboxd → the same plugin as a child (opm_host.py)",
            &p,
            &s3[1],
            None,
        );
        b.p50_row(
            "3-p50-compiled",
            "the same, toolboxd → compiled child",
            &p,
            &s3[2],
            None,
        );
        // Scenario 4 compares with the embedded half, measured in scenario 1.
        let both = embedded_echo.len() == 2 && python_echo.len() == 2;
        for (i, conns) in [1, 8].into_iter().enumerate().filter(|_| both) {
            b.rate_row(
                &format!("4-c{conns}"),
                &format!("C={conns}: calls/s, bare echo, embedded bus ÷ Python bus"),
                &embedded_echo[i],
                &python_echo[i],
                if conns == 1 {
                    Target::at_least(1.4, "≥ 1.4×")
                } else {
                    Target::at_least(7.0, "≥ 7×")
                },
            );
        }
        if both {
            b.cpu_row(
                "4-c8-cpu",
                "C=8: the bus's CPU per call, Python bus ÷ embedded bus",
                python_echo[1].bus_cpu_per_call_us,
                embedded_echo[1].bus_cpu_per_call_us,
            );
        }
        drop(pybus);
    }

    // 5: memory at 20 toolboxes, both whole services.
    let bus = embedded_bus();
    if b.runs("5") {
        let mut s5 = Vec::new();
        for (tag, variant) in [
            ("twenty-compiled", &compiled),
            ("twenty-python", &python_child),
            ("twenty-plugin", &plugin_child),
        ] {
            let d = b.daemon(&bus.url, tag, variant, 20, "");
            let service = format!("toolboxd + 20 × {}", variant.label);
            b.listed(&service, &bus.url, 20 * variant.tools).await;
            s5.push(b.memory("5", &service, 20, d.pid()));
        }
        let svc = python_service(&bus.url, &home, 20);
        let service = "Python service + 20 × the plugin (in process)";
        b.listed(service, &bus.url, 40).await;
        let p = b.memory("5", service, 20, svc.pid());
        drop(svc);
        let tree = |s: &Option<Split>| s.map(|s| s.tree);
        b.memory_row(
        "5-mem",
        "20 toolboxes: memory of the whole service, toolboxd + 20 Python children ÷ the Python service + 20 plugins",
        tree(&s5[1]),
        tree(&p),
        Target::at_most(1.0 / 3.0, "≤ 1/3"),
    );
        b.memory_row(
            "5-mem-plugin",
            "the same, toolboxd + 20 × the plugin as a child (opm_host.py)",
            tree(&s5[2]),
            tree(&p),
            None,
        );
        b.memory_row(
            "5-mem-compiled",
            "the same, toolboxd + 20 compiled children",
            tree(&s5[0]),
            tree(&p),
            None,
        );
        b.memory_row(
            "5-mem-own",
            "the same, toolboxd without children (daemon + keeper)",
            s5[1].map(|s| s.without_children),
            tree(&p),
            None,
        );
        let own = s5[0].map(|s| s.without_children);
        b.row(
        "5-mem-added",
        "20 compiled toolboxes up: memory of everything toolboxd adds (daemon + keeper, not the toolboxes), in MiB",
        own,
        own.map_or("n/a".into(), fmt_mib),
        Target::at_most(15.0, "≤ 15 MiB"),
    );
    }
    if b.runs("6") {
        // 6: start -> first ovos.tools.list with every example tool, vs the slowest
        // child's own start; medians of STARTS starts each.
        const STARTS: usize = 3;
        let median = |mut v: Vec<Duration>| {
            v.sort();
            v.get(v.len() / 2).copied()
        };
        let manifests = root().join("manifests");
        let (mut math, mut text, mut tools) = (Vec::new(), Vec::new(), 0);
        for _ in 0..STARTS {
            let (t, math_tools) = child_startup(
                "python3",
                &["../examples/python/math_toolbox.py"],
                &manifests,
            );
            math.push(t);
            let (t, text_tools) =
                child_startup("../examples/shell/text_toolbox.sh", &[], &manifests);
            text.push(t);
            tools = math_tools + text_tools;
        }
        let (math, text) = (
            median(math).unwrap_or_default(),
            median(text).unwrap_or_default(),
        );
        let slowest = math.max(text);
        let dir = tempdir("startup");
        for f in ["math.toml", "text.toml"] {
            let text = std::fs::read_to_string(manifests.join(f))
                .expect("reading an example manifest")
                .replace("../examples", &examples.display().to_string());
            std::fs::write(dir.join(f), text).expect("writing a manifest");
        }
        let mut starts = Vec::new();
        for _ in 0..STARTS {
            let started = Instant::now();
            let d = daemon(&bus.url, &dir);
            if let Some((_, first)) = b.listed("6: the example toolboxes", &bus.url, tools).await {
                starts.push(first - started);
            }
            drop(d);
        }
        let to_list = median(starts.clone()).filter(|_| starts.len() == STARTS);
        let r = to_list.and_then(|t| ratio(t.as_secs_f64(), slowest.as_secs_f64()));
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        b.row(
        "6-start",
        &format!("start → first `ovos.tools.list` with every example tool ÷ the slowest example child's own start (medians of {STARTS})"),
        r,
        format!(
            "{} ({} ms vs {:.0} ms; math {:.0} ms, text {:.0} ms)",
            fmt_ratio(r),
            to_list.map_or("n/a".into(), |t| format!("{:.0}", ms(t))),
            ms(slowest),
            ms(math),
            ms(text)
        ),
        Target::at_most(1.2, "≤ 1.2×"),
    );

        // 6 (compiled): start -> every tool listed, 1 and 20 compiled toolboxes,
        // against the compiled child's own start: what the daemon adds, in ms.
        let own = median(
            (0..STARTS)
                .map(|_| child_startup(&compiled.command.display().to_string(), &[], &manifests).0)
                .collect(),
        )
        .unwrap_or_default();
        // The twenty children's own starts, all at once (each on a thread of
        // the benchmark), with neither daemon nor sandbox: the floor of the
        // 20-toolbox start (on a machine with fewer cores than children,
        // their start alone is longer than one child's).
        let command = compiled.command.display().to_string();
        let together = median(
            (0..STARTS)
                .map(|_| {
                    let started = Instant::now();
                    std::thread::scope(|threads| {
                        for _ in 0..20 {
                            threads.spawn(|| child_startup(&command, &[], &manifests));
                        }
                    });
                    started.elapsed()
                })
                .collect(),
        );
        for count in [1usize, 20] {
            // One toolbox against its child's own start; twenty against the
            // twenty children started together.
            let floor = if count == 1 { Some(own) } else { together };
            let dir = tempdir(&format!("startup-compiled-{count}"));
            for i in 0..count {
                compiled.manifest(&dir, &format!("c{i}"), "");
            }
            let mut starts = Vec::new();
            for _ in 0..STARTS {
                let started = Instant::now();
                let d = daemon(&bus.url, &dir);
                let what = format!("6: {count} compiled toolboxes");
                if let Some((_, first)) = b.listed(&what, &bus.url, count * compiled.tools).await {
                    starts.push(first - started);
                }
                drop(d);
            }
            let to_list = median(starts.clone()).filter(|_| starts.len() == STARTS);
            let added = to_list.zip(floor).map(|(t, f)| ms(t) - ms(f));
            let against = if count == 1 {
                "the child's own start"
            } else {
                "the same 20 children started together"
            };
            b.row(
            &format!("6-start-compiled-{count}"),
            &format!(
                "start → every tool listed, {count} compiled toolbox{}: what the daemon adds to {against}, in ms (medians of {STARTS})",
                if count == 1 { "" } else { "es" }
            ),
            added,
            format!(
                "{} ms ({} ms vs {:.1} ms)",
                added.map_or("n/a".into(), |a| format!("+{a:.0}")),
                to_list.map_or("n/a".into(), |t| format!("{:.0}", ms(t))),
                floor.map_or(0.0, ms)
            ),
            Target::at_most(20.0, "≤ +20 ms"),
        );
        }
        b.row(
            "6-start-compiled-20-bare",
            "the same 20 children started at once by the benchmark (no daemon, no sandbox): until the last has listed its tools, in ms (medians of 3)",
            together.map(ms),
            together.map_or("n/a".into(), |t| format!("{:.0} ms", ms(t))),
            None,
        );
    }
    if b.runs("7") {
        // 7: 200 toolboxes x 10 tools vs 2 x 10: list round trip and memory.
        let mut s7 = Vec::new();
        for count in [2usize, 200] {
            let d = b.daemon(
                &bus.url,
                &format!("many{count}"),
                &compiled,
                count,
                "env = { EXTRA_TOOLS = \"6\" }",
            );
            let service = format!("toolboxd + {count} compiled children × 10 tools");
            let rt = b
                .listed(&format!("7: {service}"), &bus.url, count * 10)
                .await
                .map(|(rt, _)| rt);
            let mem = b.memory("7", &service, count, d.pid());
            s7.push((rt, mem));
            drop(d);
        }
        let r = s7[1]
            .0
            .zip(s7[0].0)
            .and_then(|(l, s)| ratio(l.as_secs_f64(), s.as_secs_f64()));
        let us = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e6);
        b.row(
            "7-list",
            "`ovos.tools.list` round trip, 200 toolboxes × 10 tools ÷ 2 × 10 (100× the data)",
            r,
            format!(
                "{} ({} vs {})",
                fmt_ratio(r),
                fmt_us(us(s7[1].0)),
                fmt_us(us(s7[0].0))
            ),
            Target::at_most(10.0, "≤ 10×"),
        );
        let per_box =
            |f: fn(&Split) -> f64| s7[1].1.zip(s7[0].1).map(|(l, s)| (f(&l) - f(&s)) / 198.0);
        let (tree_per, own_per) = (per_box(|s| s.tree), per_box(|s| s.without_children));
        b.row(
            "7-mem",
            "memory per added toolbox (2 → 200 compiled children), whole tree",
            tree_per,
            format!(
                "{} a toolbox ({} of it toolboxd's: daemon + keeper)",
                tree_per.map_or("n/a".into(), |m| format!("{:.2} MiB", m)),
                own_per.map_or("n/a".into(), |m| format!("{:.2} MiB", m))
            ),
            None,
        );
    }
    if b.runs("8") {
        // 8: a CPU-bound Python tool, instances = 2 vs 1.
        let cpu_toolbox = Variant {
            label: "CPU-bound Python child",
            command: py.clone(),
            args: vec![root().join("bench/cpu_toolbox.py").display().to_string()],
            tools: 1,
        };
        let mut s8 = Vec::new();
        for instances in [1, 2] {
            let d = b.daemon(
                &bus.url,
                &format!("cpu{instances}"),
                &cpu_toolbox,
                1,
                &format!("instances = {instances}"),
            );
            let service =
                format!("toolboxd → CPU-bound Python child (5 ms), instances = {instances}");
            s8.push(b.load("8", &service, &bus, Call::Burn, 8, d.pid()).await);
        }
        b.rate_row(
            "8-instances",
            "CPU-bound Python tool (5 ms), C=8: calls/s, `instances = 2` ÷ `1`",
            &s8[1],
            &s8[0],
            Target::at_least(1.7, "≥ 1.7×"),
        );
    }
    if b.runs("9") {
        // 9: 100 concurrent 0.2 s calls to one toolbox.
        let d = b.daemon(
            &bus.url,
            "concurrent",
            &compiled,
            1,
            "[limits]\nmax_concurrent_calls = 128\n",
        );
        let (took, faults) = concurrent(&bus.url, 100, 200).await;
        drop(d);
        let ok = faults.errors + faults.timeouts == 0;
        b.faults("9: 100 concurrent calls", faults);
        let r = took
            .filter(|_| ok)
            .and_then(|t| ratio(t.as_secs_f64(), 0.2));
        b.row(
        "9-concurrent",
        "100 concurrent 0.2 s calls to one toolbox (`max_concurrent_calls = 128`): all answered ÷ one call",
        r,
        format!(
            "{} ({})",
            fmt_ratio(r),
            fmt_us(took.map(|t| t.as_secs_f64() * 1e6))
        ),
        Target::at_most(2.0, "≤ 2×"),
    );
    }
    if b.runs("10") {
        // 10: the cost of `--metrics`: C=8 on the compiled child, with and
        // without, in alternating runs so that both share the machine's noise.
        let addr = free_loopback_addr();
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for run in 1..=METRICS_RUNS {
            for metrics in [false, true] {
                let flags: &[&str] = if metrics { &["--metrics", &addr] } else { &[] };
                let d = b.daemon_flags(&bus.url, "metrics", &compiled, flags);
                if metrics {
                    if let Err(e) = scrape(&addr) {
                        b.fail(format!("10: GET /metrics: {e}"));
                    }
                }
                let service = format!(
                    "toolboxd → compiled child, metrics {} (run {run})",
                    if metrics { "on" } else { "off" }
                );
                let r = b.load("10", &service, &bus, Call::Add, 8, d.pid()).await;
                if metrics { &mut on } else { &mut off }.push(r.calls_per_s);
            }
        }
        let (on, off) = (on.iter().sum::<f64>(), off.iter().sum::<f64>());
        let r = ratio(on, off);
        let runs = METRICS_RUNS as f64;
        b.row(
        "10-metrics",
        &format!("C=8: calls/s, toolboxd → compiled child with `--metrics` ÷ without ({METRICS_RUNS} alternating runs each, embedded bus)"),
        r,
        format!(
            "{} ({} vs {} /s)",
            fmt_ratio(r),
            thousands(on / runs),
            thousands(off / runs)
        ),
        Target::at_least(0.95, "≥ 0.95"),
    );
    }
    if b.runs("11") {
        // 11: 10,000 manifests, and the installed binary.
        scale::scale(b, &bus, &compiled);
    }
    drop(bus);

    let failures = b.report.failures;
    let calls: u64 = b.report.loads.iter().map(|l| l.answered).sum();
    b.row(
        "0-checked",
        "every answer checked (mark, result, no `error`) within its deadline: wrong answers, errors, timeouts, failed measurements",
        Some(failures as f64),
        format!("{failures} (of {} calls answered in the windows, and the list and concurrency calls)", thousands(calls as f64)),
        Target::at_most(0.0, "0"),
    );
}

/// Runs of each side in scenario 10 (metrics on vs off).
pub(crate) const METRICS_RUNS: usize = 3;

/// A loopback address with a port free a moment ago, for `--metrics`.
pub(crate) fn free_loopback_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let addr = listener.local_addr().expect("its address");
    addr.to_string()
}

/// `GET /metrics` on `addr`: that it answers 200 with the calls metric's family.
pub(crate) fn scrape(addr: &str) -> Result<(), String> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(DEADLINE))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    if answer.starts_with("HTTP/1.1 200") && answer.contains("toolboxd_bus_connected 1") {
        Ok(())
    } else {
        Err(format!("unexpected answer: {:.200}", answer))
    }
}
