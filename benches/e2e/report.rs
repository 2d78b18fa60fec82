//! The report: every load, memory reading and comparison of a run, with its
//! target, as written to JSON; [`Bench`] records them as scenarios run.

use super::*;

/// A figure for a whole process tree and for its part without the toolboxes.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub(crate) struct Split {
    pub(crate) tree: f64,
    pub(crate) without_children: f64,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct LoadRecord {
    pub(crate) id: String,
    pub(crate) scenario: String,
    pub(crate) service: String,
    pub(crate) bus: String,
    pub(crate) conns: usize,
    /// Correct answers received in the measured window.
    pub(crate) answered: u64,
    pub(crate) calls_per_s: f64,
    pub(crate) p50_us: Option<f64>,
    pub(crate) p99_us: Option<f64>,
    pub(crate) errors: u64,
    pub(crate) timeouts: u64,
    /// The service's CPU in the window over the answered calls.
    pub(crate) cpu_per_call_us: Option<Split>,
    /// The bus's.
    pub(crate) bus_cpu_per_call_us: Option<f64>,
    /// The service's memory after the load.
    pub(crate) memory_mib: Option<Split>,
    pub(crate) processes: Option<usize>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct MemoryRecord {
    pub(crate) id: String,
    pub(crate) scenario: String,
    pub(crate) service: String,
    pub(crate) toolboxes: usize,
    pub(crate) processes: usize,
    pub(crate) memory_mib: Split,
}

#[derive(Serialize, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    AtLeast,
    AtMost,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Target {
    pub(crate) op: Op,
    pub(crate) value: f64,
    pub(crate) text: String,
}

impl Target {
    pub(crate) fn at_least(value: f64, text: &str) -> Option<Self> {
        Some(Self {
            op: Op::AtLeast,
            value,
            text: text.to_owned(),
        })
    }

    pub(crate) fn at_most(value: f64, text: &str) -> Option<Self> {
        Some(Self {
            op: Op::AtMost,
            value,
            text: text.to_owned(),
        })
    }

    pub(crate) fn met(&self, value: f64) -> bool {
        match self.op {
            Op::AtLeast => value >= self.value,
            Op::AtMost => value <= self.value,
        }
    }
}

/// One line of the targets table: a comparison, with its target if it has one.
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Row {
    pub(crate) id: String,
    pub(crate) scenario: String,
    pub(crate) what: String,
    pub(crate) figure: String,
    pub(crate) value: Option<f64>,
    pub(crate) target: Option<Target>,
    /// None for a row without a target.
    pub(crate) pass: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Report {
    pub(crate) format: u32,
    pub(crate) finished: String,
    pub(crate) commit: Option<String>,
    /// Uncommitted changes to the measured code (src, examples, benches, bench, Cargo.*).
    pub(crate) uncommitted: Vec<String>,
    pub(crate) kernel: Option<String>,
    pub(crate) cpus: usize,
    /// "PSS", or "RSS" where the kernel has no smaps_rollup.
    pub(crate) memory_measure: String,
    /// The share of the machine's CPU used during the run by processes
    /// other than the benchmark's own tree: load that skews the figures.
    pub(crate) other_cpu_share: Option<f64>,
    pub(crate) run_ms: u64,
    pub(crate) warmup_ms: u64,
    pub(crate) deadline_ms: u64,
    pub(crate) rows: Vec<Row>,
    pub(crate) loads: Vec<LoadRecord>,
    pub(crate) memory: Vec<MemoryRecord>,
    /// Wrong answers, errors, timeouts and failed measurements.
    pub(crate) failures: u64,
    /// The first of them, in words.
    pub(crate) errors: Vec<String>,
}

pub(crate) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

pub(crate) fn ratio(a: f64, b: f64) -> Option<f64> {
    let r = a / b;
    (b > 0.0 && r.is_finite()).then_some(r)
}

pub(crate) fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("n/a".into(), |r| format!("{}×", fmt_value(r)))
}

/// A ratio or count: three significant digits up to 100 (so that a figure
/// near its target never rounds across it), whole numbers as such.
pub(crate) fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

pub(crate) fn thousands(x: f64) -> String {
    let s = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

pub(crate) fn fmt_us(us: Option<f64>) -> String {
    match us {
        None => "n/a".into(),
        Some(us) if us < 1_000.0 => format!("{us:.0} µs"),
        Some(us) if us < 10_000.0 => format!("{:.2} ms", us / 1e3),
        Some(us) if us < 1_000_000.0 => format!("{:.1} ms", us / 1e3),
        Some(us) => format!("{:.2} s", us / 1e6),
    }
}

pub(crate) fn fmt_mib(m: f64) -> String {
    format!("{m:.1} MiB")
}

/// "a / b", or "a" when both are the same (no children).
pub(crate) fn fmt_split(s: Option<Split>, f: impl Fn(f64) -> String) -> String {
    match s {
        None => "n/a".into(),
        Some(s) if f(s.tree) == f(s.without_children) => f(s.tree),
        Some(s) => format!("{} / {}", f(s.tree), f(s.without_children)),
    }
}

pub(crate) fn commit() -> (Option<String>, Vec<String>) {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"]).map(|s| s.trim().to_owned());
    let dirty = git(&[
        "status",
        "--porcelain",
        "--",
        "src",
        "examples",
        "benches",
        "bench",
        "Cargo.toml",
        "Cargo.lock",
    ])
    .map(|s| {
        s.lines()
            .map(|l| l.get(3..).unwrap_or(l).to_owned())
            .collect()
    })
    .unwrap_or_default();
    (head, dirty)
}

/// UTC "YYYY-MM-DD HH:MM" of a SystemTime.
pub(crate) fn utc(t: SystemTime) -> String {
    // "YYYY-MM-DDTHH:MM:SS.mmmZ" from the daemon's own clock.
    let full = toolboxd::util::clock::rfc3339(t);
    format!(
        "{} UTC",
        full.get(..16).unwrap_or(&full).replacen('T', " ", 1)
    )
}

/// The run in progress: what has been measured so far.
pub(crate) struct Bench {
    pub(crate) report: Report,
    pub(crate) home: PathBuf,
    /// The scenarios to run (`--only 1,6`), by number; `None`: all of them.
    pub(crate) only: Option<HashSet<String>>,
}

impl Bench {
    pub(crate) fn new(home: PathBuf, only: Option<HashSet<String>>) -> Self {
        let (commit, uncommitted) = commit();
        Self {
            report: Report {
                format: FORMAT,
                finished: String::new(),
                commit,
                uncommitted,
                kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .ok()
                    .map(|s| s.trim().to_owned()),
                cpus: std::thread::available_parallelism().map_or(0, usize::from),
                memory_measure: "PSS".into(),
                other_cpu_share: None,
                run_ms: RUN.as_millis() as u64,
                warmup_ms: WARMUP.as_millis() as u64,
                deadline_ms: DEADLINE.as_millis() as u64,
                rows: Vec::new(),
                loads: Vec::new(),
                memory: Vec::new(),
                failures: 0,
                errors: Vec::new(),
            },
            home,
            only,
        }
    }

    /// Whether scenario `n` is to run.
    pub(crate) fn runs(&self, n: &str) -> bool {
        self.only.as_ref().is_none_or(|only| only.contains(n))
    }

    pub(crate) fn fail(&mut self, text: String) {
        eprintln!("  ERROR: {text}");
        self.report.failures += 1;
        if self.report.errors.len() < 50 {
            self.report.errors.push(text);
        }
    }

    pub(crate) fn faults(&mut self, what: &str, faults: Faults) {
        let (count, texts) = (faults.errors + faults.timeouts, faults.texts);
        if count == 0 {
            return;
        }
        eprintln!(
            "  ERROR: {what}: {} errors, {} timeouts",
            faults.errors, faults.timeouts
        );
        self.report.failures += count;
        for t in texts {
            if self.report.errors.len() < 50 {
                self.report.errors.push(format!("{what}: {t}"));
            }
        }
    }

    /// The memory of `pid`'s tree, or None after recording the failure.
    pub(crate) fn memory_of(&mut self, what: &str, pid: u32) -> Option<procfs::Memory> {
        match procfs::memory(pid) {
            Ok(m) => {
                if m.rss {
                    self.report.memory_measure = "RSS (no /proc/PID/smaps_rollup)".into();
                }
                Some(m)
            }
            Err(e) => {
                self.fail(format!("{what}: memory: {e:#}"));
                None
            }
        }
    }

    /// A load on `bus`, measuring the tree of `pid` (the service) and the bus.
    pub(crate) async fn load(
        &mut self,
        scenario: &str,
        service: &str,
        bus: &Bus,
        call: Call,
        conns: usize,
        pid: u32,
    ) -> LoadRecord {
        let r = load(&bus.url, call, conns, pid, Some(bus.proc.pid())).await;
        self.record(scenario, service, bus, conns, pid, r)
    }

    /// Records the load `r` of `service` (pid `pid`) with `conns` in flight
    /// on `bus`, and says its figures.
    pub(crate) fn record(
        &mut self,
        scenario: &str,
        service: &str,
        bus: &Bus,
        conns: usize,
        pid: u32,
        r: LoadResult,
    ) -> LoadRecord {
        let what = format!("{scenario}: {service}, {} bus, C={conns}", bus.name);
        let (errors, timeouts) = (r.faults.errors, r.faults.timeouts);
        self.faults(&what, r.faults);
        let answered = r.answered.max(1) as f64;
        let per_call = |d: Duration| d.as_secs_f64() * 1e6 / answered;
        let (cpu, bus_cpu) = match r.cpu {
            Ok((cpu, bus_cpu)) if r.answered > 0 => (
                Some(Split {
                    tree: per_call(cpu.tree),
                    without_children: per_call(cpu.own),
                }),
                bus_cpu.map(per_call),
            ),
            Ok(_) => (None, None),
            Err(e) => {
                self.fail(format!("{what}: CPU: {e:#}"));
                (None, None)
            }
        };
        let memory = self.memory_of(&what, pid);
        let pick = |q: f64| {
            let n = r.latencies.len();
            (n > 0).then(|| r.latencies[((n - 1) as f64 * q) as usize].as_secs_f64() * 1e6)
        };
        let record = LoadRecord {
            id: format!(
                "{scenario}-{}-{}-c{conns}",
                service
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .collect::<Vec<_>>()
                    .join("-")
                    .to_lowercase(),
                bus.name.to_lowercase()
            ),
            scenario: scenario.into(),
            service: service.into(),
            bus: bus.name.into(),
            conns,
            answered: r.answered,
            calls_per_s: r.answered as f64 / RUN.as_secs_f64(),
            p50_us: pick(0.5),
            p99_us: pick(0.99),
            errors,
            timeouts,
            cpu_per_call_us: cpu,
            bus_cpu_per_call_us: bus_cpu,
            memory_mib: memory.as_ref().map(|m| Split {
                tree: mib(m.tree_kib),
                without_children: mib(m.own_kib),
            }),
            processes: memory.as_ref().map(|m| m.processes),
        };
        eprintln!(
            "{what}: {} calls/s, p50 {}, p99 {}, CPU/call {}",
            thousands(record.calls_per_s),
            fmt_us(record.p50_us),
            fmt_us(record.p99_us),
            fmt_split(record.cpu_per_call_us, |v| fmt_us(Some(v)))
        );
        self.report.loads.push(record.clone());
        record
    }

    pub(crate) fn memory(
        &mut self,
        scenario: &str,
        service: &str,
        toolboxes: usize,
        pid: u32,
    ) -> Option<Split> {
        let what = format!("{scenario}: {service}");
        let m = self.memory_of(&what, pid)?;
        let split = Split {
            tree: mib(m.tree_kib),
            without_children: mib(m.own_kib),
        };
        eprintln!(
            "{what}: {} process(es), {} ({} without children)",
            m.processes,
            fmt_mib(split.tree),
            fmt_mib(split.without_children)
        );
        self.report.memory.push(MemoryRecord {
            id: format!("{scenario}-{}", self.report.memory.len()),
            scenario: scenario.into(),
            service: service.into(),
            toolboxes,
            processes: m.processes,
            memory_mib: split,
        });
        Some(split)
    }

    pub(crate) fn row(
        &mut self,
        id: &str,
        what: &str,
        value: Option<f64>,
        figure: String,
        target: Option<Target>,
    ) {
        let pass = target.as_ref().map(|t| value.is_some_and(|v| t.met(v)));
        let scenario = match id.split('-').next().unwrap_or(id) {
            "0" => "all".to_owned(),
            s => s.to_owned(),
        };
        eprintln!(
            "  {id}: {figure}{}",
            match (&target, pass) {
                (Some(t), Some(true)) => format!(" (target {}: met)", t.text),
                (Some(t), _) => format!(" (target {}: MISSED)", t.text),
                _ => String::new(),
            }
        );
        self.report.rows.push(Row {
            id: id.into(),
            scenario,
            what: what.into(),
            figure,
            value,
            target,
            pass,
        });
    }

    pub(crate) fn rate_row(
        &mut self,
        id: &str,
        what: &str,
        a: &LoadRecord,
        b: &LoadRecord,
        target: Option<Target>,
    ) {
        let r = ratio(a.calls_per_s, b.calls_per_s);
        let figure = format!(
            "{} ({} vs {} /s)",
            fmt_ratio(r),
            thousands(a.calls_per_s),
            thousands(b.calls_per_s)
        );
        self.row(id, what, r, figure, target);
    }

    /// a's p50 over b's.
    pub(crate) fn p50_row(
        &mut self,
        id: &str,
        what: &str,
        a: &LoadRecord,
        b: &LoadRecord,
        target: Option<Target>,
    ) {
        let r = a.p50_us.zip(b.p50_us).and_then(|(x, y)| ratio(x, y));
        let figure = format!(
            "{} ({} vs {})",
            fmt_ratio(r),
            fmt_us(a.p50_us),
            fmt_us(b.p50_us)
        );
        self.row(id, what, r, figure, target);
    }

    pub(crate) fn cpu_row(&mut self, id: &str, what: &str, a: Option<f64>, b: Option<f64>) {
        let r = a.zip(b).and_then(|(x, y)| ratio(x, y));
        let figure = format!("{} ({} vs {} per call)", fmt_ratio(r), fmt_us(a), fmt_us(b));
        self.row(id, what, r, figure, None);
    }

    pub(crate) fn memory_row(
        &mut self,
        id: &str,
        what: &str,
        a: Option<f64>,
        b: Option<f64>,
        target: Option<Target>,
    ) {
        let r = a.zip(b).and_then(|(x, y)| ratio(x, y));
        let figure = format!(
            "{} ({} vs {})",
            r.map_or("n/a".into(), fmt_value),
            a.map_or("n/a".into(), fmt_mib),
            b.map_or("n/a".into(), fmt_mib)
        );
        self.row(id, what, r, figure, target);
    }

    /// toolboxd with one `variant` (id `box`) and `flags` for `run`.
    pub(crate) fn daemon_flags(
        &self,
        url: &str,
        tag: &str,
        variant: &Variant,
        flags: &[&str],
    ) -> Proc {
        let dir = tempdir(tag);
        variant.manifest(&dir, "box", "");
        daemon_with(url, &dir, flags)
    }

    /// toolboxd with `count` copies of `variant` (ids t0, t1, ...).
    pub(crate) fn daemon(
        &self,
        url: &str,
        tag: &str,
        variant: &Variant,
        count: usize,
        extra: &str,
    ) -> Proc {
        let dir = tempdir(tag);
        for i in 0..count {
            let id = if count == 1 {
                "box".to_owned()
            } else {
                format!("t{i}")
            };
            variant.manifest(&dir, &id, extra);
        }
        daemon(url, &dir)
    }

    /// Lists the tools and checks their number: the median round trip and
    /// when the first answer came.
    pub(crate) async fn listed(
        &mut self,
        what: &str,
        url: &str,
        expected: usize,
    ) -> Option<(Duration, Instant)> {
        match list_round_trip(url).await {
            Ok((rt, n, first)) if n == expected => Some((rt, first)),
            Ok((_, n, _)) => {
                self.fail(format!("{what}: {n} tools listed, {expected} expected"));
                None
            }
            Err(e) => {
                self.fail(format!("{what}: ovos.tools.list: {e}"));
                None
            }
        }
    }
}
