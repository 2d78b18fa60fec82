//! Scenario 11: 10,000 manifests on one daemon, and the installed binary.
//!
//! Every manifest is a lazy toolbox (`[start] mode = "lazy"`) of the compiled
//! child, as a device with many toolboxes would declare them: listed from the
//! cached catalog, no process until called. The cache of one toolbox, probed
//! by `toolboxd check --probe`, is copied to the others (the same command and
//! working directory, so the same cache key). Measured: start → `ready`, one
//! `ctl status --json` (its whole command), and SIGTERM → exit; and the
//! daemon's memory with all of them listed, against the same daemon with
//! one.

use super::*;

/// Manifests in scenario 11.
const MANIFESTS: usize = 10_000;

pub(super) fn scale(b: &mut Bench, bus: &Bus, compiled: &Variant) {
    let dir = tempdir("scale");
    let (manifests, one, state) = (dir.join("m"), dir.join("one"), dir.join("state"));
    for d in [&manifests, &one, &state] {
        std::fs::create_dir_all(d).expect("creating a directory");
    }
    let manifest = |id: &str| {
        format!(
            "id = \"{id}\"\ncommand = {:?}\ncwd = {:?}\n[start]\nmode = \"lazy\"\n",
            compiled.command.display().to_string(),
            dir.display().to_string()
        )
    };
    std::fs::write(one.join("b0.toml"), manifest("b0")).expect("writing a manifest");
    let probed = Command::new(TOOLBOXD)
        .args(["check", "--probe", "--manifests"])
        .arg(&one)
        .env("STATE_DIRECTORY", &state)
        .stderr(Stdio::null())
        .status();
    let cached = state.join(".catalog/b0.json");
    if !probed.is_ok_and(|s| s.success()) || !cached.is_file() {
        b.fail("11: `toolboxd check --probe` did not cache the catalog".into());
        return;
    }
    for i in 0..MANIFESTS {
        let id = format!("b{i}");
        std::fs::write(manifests.join(format!("{id}.toml")), manifest(&id))
            .expect("writing a manifest");
        if i > 0 {
            std::fs::copy(&cached, state.join(format!(".catalog/{id}.json")))
                .expect("copying the cached catalog");
        }
    }

    // The baseline: the same daemon with one of them.
    let base = {
        let (d, _) = lazy_daemon(bus, &one, &state, &dir.join("one.sock"));
        b.memory("11", "toolboxd + 1 lazy toolbox", 1, d.pid())
    };

    let socket = dir.join("ctl.sock");
    let started = Instant::now();
    let (mut d, ready_line) = lazy_daemon(bus, &manifests, &state, &socket);
    let ready = started.elapsed();
    let memory = b.memory("11", "toolboxd + 10,000 lazy toolboxes", MANIFESTS, d.pid());
    if memory.is_some_and(|m| m.tree != m.without_children) {
        b.fail("11: a lazy toolbox has a process before its first call".into());
    }
    let listed = serde_json::from_str::<Value>(&ready_line)
        .ok()
        .and_then(|l| l["tools"].as_u64());
    let want = (MANIFESTS * compiled.tools) as u64;
    if listed != Some(want) {
        b.fail(format!(
            "11: ready with {listed:?} tools listed, {want} expected"
        ));
    }

    // ctl status, the whole command, median of 3.
    let mut took = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let out = Command::new(TOOLBOXD)
            .args(["ctl", "--control"])
            .arg(&socket)
            .args(["status", "--json"])
            .output();
        let elapsed = t.elapsed();
        match out {
            Ok(o) if o.status.success() => {
                let rows = serde_json::from_slice::<Value>(&o.stdout)
                    .ok()
                    .and_then(|v| v.as_array().map(Vec::len));
                if rows != Some(MANIFESTS) {
                    b.fail(format!("11: ctl status listed {rows:?} toolboxes"));
                }
                took.push(elapsed);
            }
            other => b.fail(format!("11: ctl status failed: {other:?}")),
        }
    }
    took.sort();
    let status = took
        .get(took.len() / 2)
        .copied()
        .filter(|_| took.len() == 3);

    let t = Instant::now();
    let pid = nix::unistd::Pid::from_raw(d.pid() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let exited = d.0.wait().map(|s| s.success());
    let shutdown = t.elapsed();
    if !matches!(exited, Ok(true)) {
        b.fail(format!("11: toolboxd did not exit cleanly: {exited:?}"));
    }

    seconds_row(
        b,
        "11-ready",
        "10,000 lazy toolboxes (cached catalogs): start → ready, every tool listed, in s",
        Some(ready),
        Target::at_most(3.0, "≤ 3 s"),
    );
    seconds_row(
        b,
        "11-status",
        "the same: `toolboxd ctl status --json` (the whole command, median of 3), in s",
        status,
        Target::at_most(0.3, "≤ 0.3 s"),
    );
    seconds_row(
        b,
        "11-shutdown",
        "the same: SIGTERM → exit, in s",
        Some(shutdown),
        Target::at_most(2.0, "≤ 2 s"),
    );
    let per = memory
        .zip(base)
        .map(|(m, b)| (m.without_children - b.without_children) * 1024.0 / (MANIFESTS - 1) as f64);
    b.row(
        "11-mem",
        "the same: the daemon's memory (daemon + keeper) per added lazy toolbox (1 → 10,000), in KiB",
        per,
        per.map_or("n/a".into(), |k| {
            format!(
                "{k:.1} KiB ({} in all)",
                fmt_mib(memory.map_or(0.0, |m| m.without_children))
            )
        }),
        None,
    );

    // The installed binary: what `cargo build --release` makes.
    let size = std::fs::metadata(TOOLBOXD).map(|m| m.len() as f64 / (1024.0 * 1024.0));
    match size {
        Ok(mib) => b.row(
            "11-binary",
            "the release binary (`cargo build --release`), in MiB",
            Some(mib),
            format!("{mib:.1} MiB"),
            Target::at_most(12.0, "≤ 12 MiB"),
        ),
        Err(e) => b.fail(format!("11: {TOOLBOXD}: {e}")),
    }
    drop(d);
}

/// toolboxd on `bus` with the lazy toolboxes of `manifests`, their catalogs
/// cached in `state`; returns once it is ready, with its `ready` log line.
fn lazy_daemon(bus: &Bus, manifests: &Path, state: &Path, socket: &Path) -> (Proc, String) {
    daemon_env(
        &bus.url,
        manifests,
        socket,
        &[],
        &[("STATE_DIRECTORY", state)],
    )
}

/// A row whose figure is a duration, in seconds.
fn seconds_row(
    b: &mut Bench,
    id: &str,
    what: &str,
    took: Option<Duration>,
    target: Option<Target>,
) {
    let value = took.map(|t| t.as_secs_f64());
    let figure = value.map_or("n/a".into(), |v| format!("{v:.3} s"));
    b.row(id, what, value, figure, target);
}
