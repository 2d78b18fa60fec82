//! Tables, the pass/fail verdict and the generated part of
//! docs/performance.md, from one or more reports.

use super::*;

/// The targets table (with the range over the runs when there are several),
/// then the loads and memory tables of the last run.
pub(crate) fn tables(reports: &[Report]) -> String {
    let Some(last) = reports.last() else {
        return String::new();
    };
    let several = reports.len() > 1;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    let shares: Vec<String> = reports
        .iter()
        .map(|r| {
            r.other_cpu_share
                .map_or("n/a".into(), |s| format!("{:.0}%", s * 100.0))
        })
        .collect();
    line(format!(
        "Other processes used {} of the machine's CPU during the run{} (/proc/stat, less the benchmark's own process tree); above a few percent, they skew the figures.",
        shares.join(", "),
        if reports.len() > 1 { "s" } else { "" }
    ));
    line(String::new());
    line("### Targets".into());
    line(String::new());
    if several {
        line(format!(
            "| # | comparison | target | last run | pass | range over {} runs | passed in |",
            reports.len()
        ));
        line("| --- | --- | --- | --- | --- | --- | --- |".into());
    } else {
        line("| # | comparison | target | result | pass |".into());
        line("| --- | --- | --- | --- | --- |".into());
    }
    for row in &last.rows {
        let target = row.target.as_ref().map_or("-".into(), |t| t.text.clone());
        let pass = match row.pass {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "-",
        };
        let mut cells = format!(
            "| {} | {} | {target} | {} | {pass} |",
            row.scenario, row.what, row.figure
        );
        if several {
            let same: Vec<&Row> = reports
                .iter()
                .filter_map(|r| r.rows.iter().find(|x| x.id == row.id))
                .collect();
            let values: Vec<f64> = same.iter().filter_map(|r| r.value).collect();
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let range = if values.is_empty() {
                "n/a".into()
            } else {
                format!("{}–{}", fmt_value(lo), fmt_value(hi))
            };
            let passed = if row.target.is_some() {
                format!(
                    "{}/{}",
                    same.iter().filter(|r| r.pass == Some(true)).count(),
                    reports.len()
                )
            } else {
                "-".into()
            };
            cells.push_str(&format!(" {range} | {passed} |"));
        }
        line(cells);
    }
    line(String::new());
    line("### Loads".into());
    line(String::new());
    line(format!(
        "Closed loop, one request in flight per connection (C); {} s measured after a {} ms warm-up. \
         \"Tree\" is the whole process tree of the service; \"own\" leaves out its toolbox children (toolboxd and its keeper). \
         Memory ({}) after the load.",
        last.run_ms as f64 / 1e3,
        last.warmup_ms,
        last.memory_measure
    ));
    line(String::new());
    line("| # | service | bus | C | calls/s | p50 | p99 | CPU/call: tree / own | bus CPU/call | memory: tree / own | errors + timeouts |".into());
    line("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |".into());
    let mut loads: Vec<&LoadRecord> = last.loads.iter().collect();
    loads.sort_by(|a, b| a.scenario.cmp(&b.scenario));
    for l in loads {
        line(format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            l.scenario,
            l.service,
            l.bus,
            l.conns,
            thousands(l.calls_per_s),
            fmt_us(l.p50_us),
            fmt_us(l.p99_us),
            fmt_split(l.cpu_per_call_us, |v| fmt_us(Some(v))),
            fmt_us(l.bus_cpu_per_call_us),
            fmt_split(l.memory_mib, fmt_mib),
            l.errors + l.timeouts
        ));
    }
    line(String::new());
    line("### Memory".into());
    line(String::new());
    line(format!(
        "{}, summed over the process tree.",
        last.memory_measure
    ));
    line(String::new());
    line("| # | service | toolboxes | processes | whole tree | without children |".into());
    line("| --- | --- | --- | --- | --- | --- |".into());
    for m in &last.memory {
        line(format!(
            "| {} | {} | {} | {} | {} | {} |",
            m.scenario,
            m.service,
            m.toolboxes,
            m.processes,
            fmt_mib(m.memory_mib.tree),
            fmt_mib(m.memory_mib.without_children)
        ));
    }
    if !last.errors.is_empty() {
        line(String::new());
        line(format!("### Errors ({})", last.failures));
        line(String::new());
        for e in &last.errors {
            line(format!("- {e}"));
        }
    }
    out
}

/// Runs with errors, and missed targets, in words.
pub(crate) fn verdict(reports: &[Report], files: &[PathBuf]) -> (Vec<String>, Vec<String>) {
    let (mut errors, mut missed) = (Vec::new(), Vec::new());
    for (r, f) in reports.iter().zip(files) {
        let run = f.display();
        if r.failures > 0 {
            errors.push(format!(
                "{run}: {} failures (wrong answers, errors, timeouts, failed measurements)",
                r.failures
            ));
        }
        for row in &r.rows {
            if let (Some(t), Some(false)) = (&row.target, row.pass) {
                missed.push(format!(
                    "{run}: {} ({}): {}, target {}",
                    row.id, row.what, row.figure, t.text
                ));
            }
        }
    }
    (errors, missed)
}

pub(crate) fn read_reports(files: &[PathBuf]) -> Vec<Report> {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .unwrap_or_else(|e| panic!("reading {}: {e}", f.display()));
            let r: Report = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not a benchmark report: {e}", f.display()));
            assert!(
                r.format == FORMAT,
                "{}: report format {}, this benchmark reads {FORMAT}",
                f.display(),
                r.format
            );
            r
        })
        .collect()
}

/// Prints the verdict; the exit code for it.
pub(crate) fn conclude(reports: &[Report], files: &[PathBuf], check: bool) -> ExitCode {
    let (errors, missed) = verdict(reports, files);
    let targets = reports
        .iter()
        .map(|r| r.rows.iter().filter(|x| x.target.is_some()).count())
        .sum::<usize>();
    println!();
    if missed.is_empty() {
        println!(
            "targets: all {targets} checks met ({} run(s))",
            reports.len()
        );
    } else {
        println!(
            "targets: {} of {targets} checks missed ({} run(s)):",
            missed.len(),
            reports.len()
        );
        for m in &missed {
            println!("  MISSED {m}");
        }
    }
    for e in &errors {
        println!("  FAILED {e}");
    }
    if !errors.is_empty() || (check && !missed.is_empty()) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The generated part of docs/performance.md.
pub(crate) fn doc_section(reports: &[Report], files: &[PathBuf]) -> String {
    let last = reports.last().expect("at least one report");
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(root()).unwrap_or(f).display().to_string())
        .collect();
    let first = reports
        .first()
        .map_or(String::new(), |r| r.finished.clone());
    let when = if reports.len() > 1 {
        format!("{} runs, {first} to {}", reports.len(), last.finished)
    } else {
        format!("one run, {}", last.finished)
    };
    let commit = match (&last.commit, last.uncommitted.is_empty()) {
        (Some(c), true) => format!("commit `{c}`"),
        (Some(c), false) => format!(
            "commit `{c}` with uncommitted changes to {}",
            last.uncommitted.join(", ")
        ),
        (None, _) => "no git commit".into(),
    };
    let mut out = String::new();
    out.push_str(&format!(
        "{BEGIN}\n<!-- Generated by `scripts/bench --doc` from {}; do not edit by hand. -->\n\n",
        names.join(", ")
    ));
    out.push_str(&format!(
        "Generated from {when}: {commit}; Linux {}, {} CPUs; memory as {}; every answer checked, {} s deadline.\n\n",
        last.kernel.as_deref().unwrap_or("?"),
        last.cpus,
        last.memory_measure,
        last.deadline_ms as f64 / 1e3
    ));
    out.push_str(&tables(reports));
    let (errors, missed) = verdict(reports, files);
    out.push('\n');
    if missed.is_empty() && errors.is_empty() {
        out.push_str("Every target met, no errors.\n");
    } else {
        let ids: Vec<String> = last
            .rows
            .iter()
            .filter(|r| {
                reports.iter().any(|rep| {
                    rep.rows
                        .iter()
                        .any(|x| x.id == r.id && x.pass == Some(false))
                })
            })
            .map(|r| format!("`{}`", r.id))
            .collect();
        if !ids.is_empty() {
            out.push_str(&format!("Missed: {}.\n", ids.join(", ")));
        }
        if !errors.is_empty() {
            out.push_str(&format!("Runs with failures: {}.\n", errors.len()));
        }
    }
    out.push_str(END);
    out
}

pub(crate) fn write_doc(doc: &Path, reports: &[Report], files: &[PathBuf]) {
    let text =
        std::fs::read_to_string(doc).unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
    let (Some(b), Some(e)) = (text.find(BEGIN), text.find(END)) else {
        panic!("{}: no {BEGIN} ... {END} markers", doc.display());
    };
    assert!(b < e, "{}: {END} before {BEGIN}", doc.display());
    let new = format!(
        "{}{}{}",
        &text[..b],
        doc_section(reports, files),
        &text[e + END.len()..]
    );
    std::fs::write(doc, new).unwrap_or_else(|e| panic!("writing {}: {e}", doc.display()));
    println!("rewrote the generated tables of {}", doc.display());
}
