//! What a toolbox's children use, as /proc shows it: the processes of each
//! child's tree (its cgroup where it has one, else its descendants and its
//! process group), their memory and their CPU time. For `ctl status`; it reads
//! /proc, so run it off the runtime thread.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// What the process trees of some children use, summed.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Processes counted (those that vanished while being read are not).
    pub processes: usize,
    /// Proportional set size where the kernel reports it
    /// (/proc/PID/smaps_rollup), else resident set size.
    pub memory_bytes: u64,
    /// User and system time of the live processes and of the children they
    /// reaped.
    pub cpu: Duration,
}

/// The summed usage of the trees of `roots` (children's pids); `None` when
/// none of them could be read.
pub fn usage(roots: &[u32]) -> Option<Usage> {
    let mut members = BTreeSet::new();
    let mut scan = None;
    for &root in roots {
        match crate::process::cgroup::Cgroups::get_if_created().and_then(|c| c.procs_of(root)) {
            Some(procs) => members.extend(procs),
            None => {
                let table = scan.get_or_insert_with(scan_proc);
                members.extend(descendants(table, root));
            }
        }
    }
    let mut total = Usage::default();
    for pid in members {
        let Some(stat) = read_stat(pid) else { continue };
        let Some(memory) = memory_bytes(pid) else {
            continue;
        };
        total.processes += 1;
        total.memory_bytes += memory;
        total.cpu += stat.cpu;
    }
    (total.processes > 0).then_some(total)
}

/// What /proc/PID/stat tells about one process.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    /// Its parent.
    ppid: u32,
    /// Its process group.
    pgrp: u32,
    /// utime + stime + cutime + cstime.
    cpu: Duration,
}

/// Whether process `pid` was started by `ancestor`, or by a process it
/// started, and so on (at most 64 generations up; a process reparented to
/// init after its parent died is no longer counted).
pub fn descends_from(pid: u32, ancestor: u32) -> bool {
    let mut pid = pid;
    for _ in 0..64 {
        match read_stat(pid) {
            Some(stat) if stat.ppid == ancestor => return true,
            Some(stat) if stat.ppid > 1 => pid = stat.ppid,
            _ => return false,
        }
    }
    false
}

/// Reads /proc/PID/stat; `None` if the process is gone.
fn read_stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Parses a /proc/PID/stat line (the command may hold spaces and parentheses:
/// the fields start after the last ')').
fn parse_stat(text: &str) -> Option<Stat> {
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let ticks = (11..=14).try_fold(0u64, |sum, i| Some(sum + number(i)?))?;
    Some(Stat {
        ppid: u32::try_from(number(1)?).ok()?,
        pgrp: u32::try_from(number(2)?).ok()?,
        cpu: Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64),
    })
}

/// Clock ticks per second (the unit of the CPU times in /proc/PID/stat).
fn clock_ticks() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

/// Every process's stat, by pid.
fn scan_proc() -> HashMap<u32, Stat> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, read_stat(pid)?)))
        .collect()
}

/// `root`, its descendants and the members of its process group, in `table`.
fn descendants(table: &HashMap<u32, Stat>, root: u32) -> BTreeSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, stat) in table {
        children.entry(stat.ppid).or_default().push(pid);
    }
    let group = table
        .iter()
        .filter(|(_, s)| s.pgrp == root)
        .map(|(&pid, _)| pid);
    let mut next: Vec<u32> = std::iter::once(root).chain(group).collect();
    let mut found = BTreeSet::new();
    while let Some(pid) = next.pop() {
        if table.contains_key(&pid) && found.insert(pid) {
            next.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    found
}

/// The memory of process `pid`: PSS, else RSS; `None` if it is gone.
fn memory_bytes(pid: u32) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
        if let Some(kib) = kib_field(&text, "Pss:") {
            return Some(kib * 1024);
        }
    }
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

/// The value of a `Key:   123 kB` line.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The size of a memory page.
fn page_size() -> u64 {
    // SAFETY: sysconf only reads a configuration value.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_whatever_the_command_is_called() {
        let ticks = clock_ticks();
        let line = format!(
            "42 (a (weird) name) S 7 42 42 0 -1 4194560 1 0 0 0 {} {} {} {} 20 0 1 0",
            ticks,
            ticks * 2,
            ticks / 2,
            ticks / 2
        );
        let stat = parse_stat(&line).expect("a stat line");
        assert_eq!((stat.ppid, stat.pgrp), (7, 42));
        assert_eq!(stat.cpu, Duration::from_secs(4));
        assert_eq!(parse_stat("42 (x) S 7"), None);
    }

    #[test]
    fn a_tree_is_the_descendants_and_the_process_group() {
        let stat = |ppid, pgrp| Stat {
            ppid,
            pgrp,
            cpu: Duration::ZERO,
        };
        // 10 → 11 → 12; 13 left 10's group (setsid) but is its child;
        // 14 was reparented to 1 but is still in group 10; 20 is unrelated.
        let table: HashMap<u32, Stat> = [
            (1, stat(0, 1)),
            (10, stat(1, 10)),
            (11, stat(10, 10)),
            (12, stat(11, 10)),
            (13, stat(10, 13)),
            (14, stat(1, 10)),
            (20, stat(1, 20)),
        ]
        .into_iter()
        .collect();
        let tree: Vec<u32> = descendants(&table, 10).into_iter().collect();
        assert_eq!(tree, [10, 11, 12, 13, 14]);
    }

    #[test]
    fn a_child_and_its_child_descend_from_this_process_and_not_the_reverse() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let grandchild = loop {
            let found = scan_proc()
                .into_iter()
                .find(|(_, stat)| stat.ppid == child.id())
                .map(|(pid, _)| pid);
            if let Some(pid) = found {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "no grandchild");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(descends_from(child.id(), me));
        assert!(descends_from(grandchild, me));
        assert!(!descends_from(me, child.id()));
        assert!(!descends_from(me, me));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn measures_this_process() {
        let me = std::process::id();
        let usage = usage(&[me]).expect("this process can read itself");
        assert!(usage.processes >= 1);
        assert!(usage.memory_bytes > 1024 * 1024, "{usage:?}");
        assert!(kib_field("Rss:  12 kB\nPss:   7 kB\n", "Pss:") == Some(7));
    }
}
