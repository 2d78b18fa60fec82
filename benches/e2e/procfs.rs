//! /proc: process trees, their CPU time and memory.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

#[derive(Clone, Copy)]
struct Stat {
    ppid: u32,
    /// utime + stime, in clock ticks.
    ticks: u64,
    /// cutime + cstime: children waited for.
    reaped: u64,
}

fn parse_stat(text: &str) -> Option<Stat> {
    let rest = text.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
    Some(Stat {
        ppid: u32::try_from(num(1)?).ok()?,
        ticks: num(11)? + num(12)?,
        reaped: num(13)? + num(14)?,
    })
}

fn gone(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Every process's stat.
fn scan() -> Result<HashMap<u32, Stat>> {
    let mut all = HashMap::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let entry = entry.context("reading /proc")?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let path = format!("/proc/{pid}/stat");
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let stat =
                    parse_stat(&text).ok_or_else(|| anyhow!("{path}: cannot parse {text:?}"))?;
                all.insert(pid, stat);
            }
            // Exited between the listing and the read; if it belonged to a
            // tree we watch, its parent's `reaped` has its time.
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e).with_context(|| format!("reading {path}")),
        }
    }
    Ok(all)
}

fn is_helper(pid: u32) -> Result<bool> {
    let path = format!("/proc/{pid}/cmdline");
    let raw = std::fs::read(&path).with_context(|| format!("reading {path}"))?;
    Ok(raw.split(|&b| b == 0).nth(1) == Some(toolboxd::process::keeper::SUBCOMMAND.as_bytes()))
}

/// A process tree: the service's own processes (the root and the
/// `__keeper` helper under it) and the rest (toolboxes and their
/// descendants).
struct Tree {
    own: Vec<u32>,
    children: Vec<u32>,
    stats: HashMap<u32, Stat>,
}

fn tree(root: u32) -> Result<Tree> {
    let stats = scan()?;
    if !stats.contains_key(&root) {
        bail!("process {root} is gone");
    }
    let mut kids: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, stat) in &stats {
        kids.entry(stat.ppid).or_default().push(pid);
    }
    let (mut own, mut children) = (vec![root], Vec::new());
    let mut stack = vec![(root, true)];
    while let Some((pid, own_part)) = stack.pop() {
        for &kid in kids.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            let helper = own_part && is_helper(kid)?;
            if helper {
                own.push(kid);
            } else {
                children.push(kid);
            }
            stack.push((kid, helper));
        }
    }
    Ok(Tree {
        own,
        children,
        stats,
    })
}

/// CPU used so far by a tree, and by its own part.
#[derive(Clone, Copy)]
pub(crate) struct Cpu {
    pub(crate) tree: Duration,
    pub(crate) own: Duration,
}

fn ticks(n: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).unwrap_or(100).max(1);
    Duration::from_micros(n * 1_000_000 / hz)
}

/// The machine's busy CPU time so far, all CPUs (/proc/stat).
pub(crate) fn machine_busy() -> Result<Duration> {
    let text = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or_else(|| anyhow!("/proc/stat: no cpu line"))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().context("/proc/stat: a field is not a number"))
        .collect::<Result<_>>()?;
    // user nice system idle iowait irq softirq steal: user, nice, system
    // and steal. Interrupt time is left out: much of it is the loopback
    // traffic of the benchmark itself.
    let busy = [0, 1, 2, 7].iter().filter_map(|&i| f.get(i)).sum();
    Ok(ticks(busy))
}

/// Utime + stime of every process in the tree, plus the time of the
/// children they reaped (so a toolbox that exits keeps counting).
pub(crate) fn cpu(root: u32) -> Result<Cpu> {
    let t = tree(root)?;
    let sum = |pids: &[u32], with_reaped: bool| -> u64 {
        pids.iter()
            .filter_map(|p| t.stats.get(p))
            .map(|s| s.ticks + if with_reaped { s.reaped } else { 0 })
            .sum()
    };
    Ok(Cpu {
        tree: ticks(sum(&t.own, true) + sum(&t.children, true)),
        own: ticks(sum(&t.own, false)),
    })
}

/// Memory of a tree and of its own part, in KiB.
pub(crate) struct Memory {
    pub(crate) tree_kib: u64,
    pub(crate) own_kib: u64,
    pub(crate) processes: usize,
    /// RSS was read instead of PSS (no smaps_rollup on this kernel).
    pub(crate) rss: bool,
}

fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// PSS (proportional set size) of one process, or RSS where the kernel
/// has no smaps_rollup; the bool says RSS.
fn pss_kib(pid: u32) -> Result<(u64, bool)> {
    let path = format!("/proc/{pid}/smaps_rollup");
    match std::fs::read_to_string(&path) {
        Ok(text) => field_kib(&text, "Pss:")
            .map(|v| (v, false))
            .ok_or_else(|| anyhow!("{path}: no Pss line (a zombie?)")),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && std::path::Path::new(&format!("/proc/{pid}/stat")).exists() =>
        {
            let status = format!("/proc/{pid}/status");
            let text =
                std::fs::read_to_string(&status).with_context(|| format!("reading {status}"))?;
            let rss =
                field_kib(&text, "VmRSS:").ok_or_else(|| anyhow!("{status}: no VmRSS line"))?;
            Ok((rss, true))
        }
        Err(e) => Err(e).with_context(|| format!("reading {path}")),
    }
}

pub(crate) fn memory(root: u32) -> Result<Memory> {
    let t = tree(root)?;
    let mut rss = false;
    let mut sum = |pids: &[u32]| -> Result<u64> {
        let mut total = 0;
        for &pid in pids {
            let (kib, fallback) = pss_kib(pid)?;
            rss |= fallback;
            total += kib;
        }
        Ok(total)
    };
    let own_kib = sum(&t.own)?;
    let children_kib = sum(&t.children)?;
    Ok(Memory {
        tree_kib: own_kib + children_kib,
        own_kib,
        processes: t.own.len() + t.children.len(),
        rss,
    })
}
