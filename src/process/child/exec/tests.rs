//! Tests of starting a child: what it runs with, its errors, its cgroup.

use super::*;
use std::io::Read;

fn run(command: &Command, memory: Memory) -> (String, i32) {
    let launched = spawn(command, &|| Ok(()), memory, None).unwrap();
    drop(launched.stdin);
    let mut out = String::new();
    std::fs::File::from(launched.stdout)
        .read_to_string(&mut out)
        .unwrap();
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(launched.pid as i32, &mut status, 0) };
    (out, status)
}

fn sh(script: &str, env: &[(OsString, OsString)], cwd: &str) -> Command {
    Command::new(
        Path::new("/bin/sh"),
        ["-c", script, "x"],
        env,
        Path::new(cwd),
    )
    .unwrap()
}

#[test]
fn runs_the_program_with_its_arguments_environment_and_directory() {
    let env = [(OsString::from("GREETING"), OsString::from("hello"))];
    for memory in [Memory::Shared, Memory::Copied] {
        let command = sh("echo \"$GREETING $0\"; pwd", &env, "/tmp");
        assert_eq!(run(&command, memory), ("hello x\n/tmp\n".into(), 0));
    }
    // Only what was given: no variable of the daemon's.
    let command = Command::new(Path::new("/usr/bin/env"), [], &env, Path::new("/")).unwrap();
    assert_eq!(run(&command, Memory::Shared).0, "GREETING=hello\n");
}

#[test]
fn a_failed_step_or_exec_is_returned_with_its_errno() {
    let command = Command::new(Path::new("/bin/true"), [], &[], Path::new("/")).unwrap();
    for memory in [Memory::Shared, Memory::Copied] {
        let refused = || Err(io::Error::from_raw_os_error(libc::EPERM));
        let err = spawn(&command, &refused, memory, None).err().unwrap();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }
    let missing = Command::new(Path::new("/nonexistent/x"), [], &[], Path::new("/")).unwrap();
    let err = spawn(&missing, &|| Ok(()), Memory::Shared, None)
        .err()
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    let nowhere = Command::new(Path::new("/bin/true"), [], &[], Path::new("/nonexistent"));
    let err = spawn(&nowhere.unwrap(), &|| Ok(()), Memory::Shared, None)
        .err()
        .unwrap();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
}

#[test]
fn a_script_without_a_shebang_line_runs_under_the_shell() {
    let dir = std::env::temp_dir().join(format!("toolboxd-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("plain");
    // Written by another process: a descriptor open for writing here
    // could be copied into a child another test starts meanwhile, and
    // make the exec below fail (ETXTBSY).
    let written = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            "printf 'echo \"plain $1\"\\n' > \"$0\" && chmod 755 \"$0\"",
        ])
        .arg(&script)
        .status()
        .unwrap();
    assert!(written.success());
    let command = Command::new(&script, ["arg"], &[], &dir).unwrap();
    assert_eq!(run(&command, Memory::Shared), ("plain arg\n".into(), 0));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_child_gets_default_signals_none_blocked_and_its_own_group() {
    // SIGPIPE, which Rust ignores in the daemon, is back to its default.
    let path = [(OsString::from("PATH"), OsString::from("/usr/bin:/bin"))];
    let script = "grep -E '^(SigBlk|SigIgn)' /proc/self/status; ps -o pgid= -p $$; echo $$";
    let (out, _) = run(&sh(script, &path, "/"), Memory::Shared);
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
            .unwrap()
    };
    assert_eq!(field("SigBlk:"), 0, "{out}");
    let sigpipe = 1u64 << (libc::SIGPIPE - 1);
    assert_eq!(field("SigIgn:") & sigpipe, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    let (pgid, pid) = (lines[lines.len() - 2].trim(), lines[lines.len() - 1].trim());
    assert_eq!(pgid, pid, "the child leads a process group of its own");
}

#[test]
fn a_nul_byte_is_refused_before_anything_starts() {
    let err = Command::new(Path::new("/bin/true"), ["a\0b"], &[], Path::new("/"))
        .err()
        .unwrap();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn the_child_runs_in_its_cgroup_from_its_start() {
    let Some(cgroups) = crate::process::cgroup::Cgroups::get() else {
        eprintln!("skipped: no cgroup v2 hierarchy this process may write");
        return;
    };
    let cgroup = cgroups.new_child("exec-test").unwrap();
    let dir = std::fs::File::open(cgroup.dir()).unwrap();
    let procs = cgroup.entry();
    let target = Cgroup {
        dir: std::os::fd::AsFd::as_fd(&dir),
        procs: &procs,
    };
    let command = sh("cat /proc/self/cgroup", &[], "/");
    let inside = cgroup
        .dir()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    // Born into it (clone3, where there is one), then moving itself in.
    for clone3 in [true, false] {
        #[cfg(target_arch = "x86_64")]
        CLONE3.store(clone3, std::sync::atomic::Ordering::Relaxed);
        for memory in [Memory::Shared, Memory::Copied] {
            let launched = spawn(&command, &|| Ok(()), memory, Some(target)).unwrap();
            let mut out = String::new();
            std::fs::File::from(launched.stdout)
                .read_to_string(&mut out)
                .unwrap();
            reap(launched.pid as i32);
            let v2 = out.lines().find(|l| l.starts_with("0::")).unwrap();
            assert!(v2.ends_with(&inside), "clone3 {clone3}, {memory:?}: {out}");
        }
    }
    #[cfg(target_arch = "x86_64")]
    CLONE3.store(true, std::sync::atomic::Ordering::Relaxed);
    let probe = spawn(&command, &|| Ok(()), Memory::Shared, Some(target)).unwrap();
    reap(probe.pid as i32);
    #[cfg(target_arch = "x86_64")]
    if clone3_available() {
        // Born into it indeed (clone3 works here): with a `cgroup.procs`
        // it cannot move through, the child still starts, in its cgroup.
        let nowhere = Cgroup {
            procs: c"/nonexistent/cgroup.procs",
            ..target
        };
        let launched = spawn(&command, &|| Ok(()), Memory::Shared, Some(nowhere)).unwrap();
        let mut out = String::new();
        std::fs::File::from(launched.stdout)
            .read_to_string(&mut out)
            .unwrap();
        reap(launched.pid as i32);
        assert!(out.contains(&inside), "{out}");
    }
    cgroup.kill_and_remove();
}
