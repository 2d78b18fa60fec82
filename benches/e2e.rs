//! End-to-end benchmark, side by side in one run: toolboxd against a bare echo
//! responder on the same bus (the physical limit), against the Python tool
//! service it replaces (with Python toolboxes on both sides, and the other
//! variants as extra rows), and the embedded bus against the stock Python bus.
//! Run it with `scripts/bench`, which builds what it needs and prepares .venv.
//!
//! Every answer is matched to its request by a unique context mark and checked
//! (result value, no `error` key) within a deadline; a wrong answer, an error or
//! a timeout fails the run. Rates count answered calls. Memory (PSS) and CPU are
//! summed over each service's whole process tree, and again without the
//! toolboxes (toolboxd and its `__keeper` helper only). A failed /proc read is
//! an error, never a zero.
//!
//! Modes (the arguments after `cargo bench --bench e2e --`):
//!
//! - `[--json PATH] [--check] [--brief] [--only N,M]`: run (`--only`: those
//!   scenarios), write the figures to PATH (default target/bench/e2e.json),
//!   print the tables (`--brief`: a summary).
//! - `--report [--check] FILE...`: print the tables of earlier runs, with the
//!   range of each target's figure over the files.
//! - `--doc [--doc-file PATH] FILE...`: rewrite the generated part of
//!   docs/performance.md (between `<!-- bench:begin -->` and
//!   `<!-- bench:end -->`) from FILE....
//!
//! Exit status 1 when a run had an error, or, with `--check`, when a target
//! was missed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime};

use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use toolboxd::bus::envelope::Message;
use toolboxd::bus::{client, tcp};

#[path = "e2e/load.rs"]
mod load;
#[path = "e2e/mcp.rs"]
mod mcp;
#[path = "e2e/procfs.rs"]
mod procfs;
#[path = "e2e/procs.rs"]
mod procs;
#[path = "e2e/relay.rs"]
mod relay;
#[path = "e2e/report.rs"]
mod report;
#[path = "e2e/scale.rs"]
mod scale;
#[path = "e2e/scenarios.rs"]
mod scenarios;
#[path = "e2e/tables.rs"]
mod tables;

use load::*;
use mcp::*;
use procs::*;
use relay::*;
use report::*;
use scenarios::*;
use tables::*;

const TOOLBOXD: &str = env!("CARGO_BIN_EXE_toolboxd");
/// Measured time per load run, after a warm-up.
const RUN: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_millis(300);
/// Every request's deadline.
const DEADLINE: Duration = Duration::from_secs(5);
/// How long a process may take to say it is ready.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// Report format version.
const FORMAT: u32 = 1;
const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn echo_child() -> PathBuf {
    let path = root().join("target/release/examples/echo_toolbox");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

fn venv_python() -> PathBuf {
    let path = root().join(".venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

// ---------------------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("building the tokio runtime")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--echo-responder") {
        let url = args.get(i + 1).expect("--echo-responder URL");
        runtime().block_on(run_echo_responder(url));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == "--bare-relay") {
        let url = args.get(i + 1).expect("--bare-relay URL CHILD");
        let child = args.get(i + 2).expect("--bare-relay URL CHILD");
        runtime().block_on(run_bare_relay(url, child));
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return ExitCode::SUCCESS; // `cargo test --benches` / `cargo bench -- --list`: nothing to list
    }
    let flag = |name: &str| args.iter().any(|a| a == name);
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| {
                args.get(i + 1)
                    .unwrap_or_else(|| panic!("{name} needs a value"))
            })
            .map(PathBuf::from)
    };
    let check = flag("--check");
    // Positional arguments: report files. `--bench` is cargo's.
    let mut files = Vec::new();
    let mut skip = false;
    for a in &args {
        if skip {
            skip = false;
        } else if a == "--json" || a == "--doc-file" || a == "--only" {
            skip = true;
        } else if !a.starts_with("--") {
            files.push(PathBuf::from(a));
        }
    }
    if flag("--report") || flag("--doc") {
        assert!(!files.is_empty(), "--report and --doc need report files");
        let reports = read_reports(&files);
        if flag("--doc") {
            let doc = value("--doc-file").unwrap_or_else(|| root().join("docs/performance.md"));
            write_doc(&doc, &reports, &files);
            return ExitCode::SUCCESS;
        }
        print!("{}", tables(&reports));
        return conclude(&reports, &files, check);
    }

    let json_path = value("--json").unwrap_or_else(|| root().join("target/bench/e2e.json"));
    let home = xdg_home();
    let only = args.iter().position(|a| a == "--only").map(|i| {
        let list = args
            .get(i + 1)
            .expect("--only needs scenario numbers, e.g. 1,6");
        list.split(',').map(str::to_owned).collect()
    });
    let mut b = Bench::new(home, only);
    // The CPU others use meanwhile: the machine's busy time less this
    // process's tree (every process the benchmark starts is reaped into it).
    let cpu_now = || -> anyhow::Result<(Duration, Duration, Instant)> {
        Ok((
            procfs::machine_busy()?,
            procfs::cpu(std::process::id())?.tree,
            Instant::now(),
        ))
    };
    let before = cpu_now();
    runtime().block_on(bench(&mut b));
    match before.and_then(|b0| Ok((b0, cpu_now()?))) {
        Ok(((busy0, own0, t0), (busy1, own1, t1))) => {
            let others = busy1
                .saturating_sub(busy0)
                .saturating_sub(own1.saturating_sub(own0));
            let capacity = (t1 - t0).as_secs_f64() * b.report.cpus.max(1) as f64;
            b.report.other_cpu_share = ratio(others.as_secs_f64(), capacity);
        }
        Err(e) => b.fail(format!("the machine's CPU: {e:#}")),
    }
    b.report.finished = utc(SystemTime::now());
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir().join(format!("toolboxd-bench-{}", std::process::id())),
    );
    if let Some(dir) = json_path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    let text = serde_json::to_string_pretty(&b.report).expect("serializing the report");
    std::fs::write(&json_path, text + "\n")
        .unwrap_or_else(|e| panic!("writing {}: {e}", json_path.display()));
    let reports = [b.report];
    let files = [json_path.clone()];
    if flag("--brief") {
        let (errors, missed) = verdict(&reports, &files);
        println!(
            "{}: {} missed targets, {} failures",
            json_path.display(),
            missed.len(),
            reports[0].failures
        );
        return if !errors.is_empty() || (check && !missed.is_empty()) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    println!();
    print!("{}", tables(&reports));
    println!("\nfigures written to {}", json_path.display());
    conclude(&reports, &files, check)
}
