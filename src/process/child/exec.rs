//! How a child process is started: as `vfork` does (`CLONE_VM |
//! CLONE_VFORK`), rather than `fork` (a child that changes its user gets a
//! copy of the memory all the same: [`Memory::Copied`]). Into a cgroup on
//! x86_64, with `clone3`, where the child continues on the starting thread's
//! stack below its frame; elsewhere, or where `clone3` fails, with `clone`
//! on a spare stack (as `posix_spawn` does).
//!
//! A fork copies the daemon's page tables and write-protects its memory; until
//! the child calls `exec`, every page the daemon's other threads write is
//! copied, each copy flushing the TLB of every core the daemon runs on (on a
//! virtual machine, an interrupt per core). Measured on a 20-toolbox start,
//! that copying was the largest single cost of a spawn, and it grows with the
//! daemon's memory. Here the child borrows the daemon's memory until `exec`
//! (the thread that starts it waits meanwhile), so nothing is copied.
//!
//! The price is care in the child, which shares memory with a daemon whose
//! other threads keep running:
//!
//! - it runs only system calls on data prepared before: no allocation, no
//!   lock, no panic; outside the stack it runs on, it writes only what libc
//!   keeps in the waiting thread's thread-local storage (`errno`, and
//!   around a cancellable call its cancellation state, restored after);
//! - every signal is blocked around the clone (with the raw system call:
//!   glibc leaves its own two out), and the child sets every caught signal
//!   back to its default before unblocking them, so no handler of the
//!   daemon's ever runs in it;
//! - a child that changes its user is forked instead ([`Memory::Copied`])
//!   unless `fs.suid_dumpable` is 0: the kernel marks the memory of a
//!   process whose credentials change as dumpable per that setting, and
//!   shared memory is the daemon's (at 0 it stays undumpable, as the daemon
//!   keeps it: `child/mod.rs` decides).
//!
//! The child is born into its cgroup where it can be (`clone3` with
//! `CLONE_INTO_CGROUP`, on x86_64, Linux 5.7+): moving a process into a
//! cgroup takes the kernel's cgroup lock for writing, and the first move
//! after a pause waits for an RCU grace period (7 to 13 ms measured) with
//! every other cgroup operation queued behind it. Elsewhere the child moves
//! itself in, first thing.
//!
//! A failure before `exec` is reported through a close-on-exec pipe as the
//! `errno` of the step that failed. A child that dies before `exec` without
//! a word (killed, say) is reported as started; its exit is seen next.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The spare stack of a child started by `clone` (see [`clone_on_stack`]). The steps
/// before `exec` are shallow; the pages it does not touch cost nothing.
const STACK_BYTES: usize = 256 * 1024;

/// The shell that runs an executable script without a `#!` line.
const SH: &std::ffi::CStr = c"/bin/sh";

/// Whether the child borrows the daemon's memory until `exec`, or gets a
/// copy (a fork).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Borrowed: nothing copied; the starting thread waits for the `exec`.
    Shared,
    /// Copied, as by `fork`: for a child that changes its credentials. The
    /// starting thread waits for the `exec` all the same.
    Copied,
}

/// Everything `exec` needs, as C strings made before the clone.
pub struct Command {
    /// The executable (a path: manifests resolve the command).
    program: CString,
    /// Keeps the strings `argv` points into.
    _args: Vec<CString>,
    /// `argv`, NULL-terminated.
    argv: Vec<*const libc::c_char>,
    /// Keeps the strings `envp` points into.
    _env: Vec<CString>,
    /// `envp`, NULL-terminated.
    envp: Vec<*const libc::c_char>,
    /// `argv` for `/bin/sh` running the program as a script, for an
    /// executable that is a script without a `#!` line (as `execvp` does).
    sh_argv: Vec<*const libc::c_char>,
    /// The working directory.
    cwd: CString,
}

// SAFETY: the raw pointers point into the CStrings the Command owns, which
// never change while it lives; nothing else is shared.
unsafe impl Send for Command {}

impl Command {
    /// `program` with `args` (argv[0] is the program), environment `env` (all
    /// of it), in `cwd`. A NUL byte in any of them is an `InvalidInput` error.
    pub fn new<'a>(
        program: &Path,
        args: impl IntoIterator<Item = &'a str>,
        env: &[(OsString, OsString)],
        cwd: &Path,
    ) -> io::Result<Command> {
        let c = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a NUL byte in the command, its arguments, environment or directory",
                )
            })
        };
        let program = c(program.as_os_str().as_bytes())?;
        let mut args_c = vec![program.clone()];
        for arg in args {
            args_c.push(c(arg.as_bytes())?);
        }
        let mut env_c = Vec::with_capacity(env.len());
        for (key, value) in env {
            let mut pair = OsString::with_capacity(key.len() + value.len() + 1);
            pair.push(key);
            pair.push(OsStr::new("="));
            pair.push(value);
            env_c.push(c(pair.as_bytes())?);
        }
        let pointers = |strings: &[CString]| {
            strings
                .iter()
                .map(|s| s.as_ptr())
                .chain(std::iter::once(std::ptr::null()))
                .collect::<Vec<_>>()
        };
        let sh_argv = std::iter::once(SH.as_ptr())
            .chain(args_c.iter().map(|s| s.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        Ok(Command {
            sh_argv,
            argv: pointers(&args_c),
            envp: pointers(&env_c),
            program,
            _args: args_c,
            _env: env_c,
            cwd: c(cwd.as_os_str().as_bytes())?,
        })
    }
}

/// A started child: its pid and the daemon's ends of its stdio pipes.
pub struct Spawned {
    /// Process id; the caller reaps it.
    pub pid: u32,
    /// Writes to the child's stdin.
    pub stdin: OwnedFd,
    /// Reads the child's stdout.
    pub stdout: OwnedFd,
    /// Reads the child's stderr.
    pub stderr: OwnedFd,
}

/// The cgroup (v2) a child is to run in.
#[derive(Clone, Copy)]
pub struct Cgroup<'a> {
    /// Its directory, open: what `CLONE_INTO_CGROUP` takes.
    pub dir: BorrowedFd<'a>,
    /// Its `cgroup.procs`, for a child that moves itself in.
    pub procs: &'a CStr,
}

/// What the child's side runs with: pointers into the starting thread's
/// frame, which outlives the child's use of them (it waits for the `exec`,
/// or the child has a copy).
struct ChildArgs<'a> {
    command: &'a Command,
    /// The child's ends of its stdin, stdout and stderr pipes.
    stdio: [RawFd; 3],
    /// Where a failed step writes its errno.
    report: RawFd,
    /// The `cgroup.procs` to move into first, when not born into the cgroup.
    enter: Option<&'a CStr>,
    /// The caller's steps, last before `exec`.
    steps: &'a (dyn Fn() -> io::Result<()> + Sync),
}

/// Starts `command` with piped stdio in `cgroup` (if any), running `steps`
/// in the child just before `exec` (they must keep to the rules of the
/// module doc). Returns once the child has called `exec`; an error of any
/// step before is returned, and that child reaped.
pub fn spawn(
    command: &Command,
    steps: &(dyn Fn() -> io::Result<()> + Sync),
    memory: Memory,
    cgroup: Option<Cgroup>,
) -> io::Result<Spawned> {
    let (stdin_child, stdin) = pipe()?;
    let (stdout, stdout_child) = pipe()?;
    let (stderr, stderr_child) = pipe()?;
    let (report_read, report_write) = pipe()?;
    let args = ChildArgs {
        command,
        stdio: [
            stdin_child.as_raw_fd(),
            stdout_child.as_raw_fd(),
            stderr_child.as_raw_fd(),
        ],
        report: report_write.as_raw_fd(),
        enter: None,
        steps,
    };
    let shared = match memory {
        Memory::Shared => libc::CLONE_VM,
        Memory::Copied => 0,
    };
    // SAFETY: the signals are blocked around it (see `blocking_signals`).
    let born = cgroup
        .filter(|_| clone3_available())
        .and_then(|cgroup| unsafe {
            blocking_signals(|| clone3_into(shared as u64, cgroup.dir, &args))
        });
    let pid = match born {
        Some(pid) => pid,
        None => {
            let args = ChildArgs {
                enter: cgroup.map(|c| c.procs),
                ..args
            };
            clone_on_stack(shared | libc::CLONE_VFORK | libc::SIGCHLD, &args)?
        }
    };
    drop((stdin_child, stdout_child, stderr_child, report_write));
    if let Some(errno) = read_report(&report_read) {
        reap(pid);
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok(Spawned {
        pid: pid as u32,
        stdin,
        stdout,
        stderr,
    })
}

/// Runs `f` with every signal blocked in this thread (the raw call: glibc's
/// would leave its own two out), then restores the mask.
///
/// # Safety
/// `f` must not rely on signals.
unsafe fn blocking_signals<T>(f: impl FnOnce() -> T) -> T {
    let all: u64 = !0;
    let mut old: u64 = 0;
    let set_size = std::mem::size_of::<u64>();
    // SAFETY: the masks are plain values on this stack (the kernel's
    // sigset is 8 bytes).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &all,
            &mut old,
            set_size,
        );
    }
    let result = f();
    // SAFETY: as above.
    unsafe {
        let none = std::ptr::null_mut::<u64>();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &old,
            none,
            set_size,
        );
    }
    result
}

/// The child started by `clone` on this thread's spare stack (its copy of
/// it, when it does not share memory), entering its cgroup itself.
fn clone_on_stack(flags: libc::c_int, args: &ChildArgs) -> io::Result<libc::pid_t> {
    STACK.with(|stack| -> io::Result<libc::pid_t> {
        let mut stack = stack.borrow_mut();
        let stack = match &mut *stack {
            Some(stack) => stack,
            empty => empty.insert(Stack::new()?),
        };
        // SAFETY: the child runs `child_main` on a stack of its own with
        // `args`, which outlives its use (this thread waits for its exec or
        // exit: CLONE_VFORK), and keeps to the module's rules; signals are
        // blocked around the clone.
        let (pid, error) = unsafe {
            blocking_signals(|| {
                let pid = libc::clone(
                    child_main,
                    stack.top(),
                    flags,
                    (args as *const ChildArgs).cast_mut().cast(),
                );
                (pid, io::Error::last_os_error())
            })
        };
        if pid < 0 {
            return Err(error);
        }
        Ok(pid)
    })
}

/// The kernel's `struct clone_args` as `clone3` takes it (with `cgroup`,
/// Linux 5.7+).
#[cfg(target_arch = "x86_64")]
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Whether `clone3` with `CLONE_INTO_CGROUP` may work here (cleared when the
/// kernel has neither, or a filter refuses it).
#[cfg(target_arch = "x86_64")]
static CLONE3: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Whether a child may be started by [`clone3_into`].
fn clone3_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return CLONE3.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

/// The child started by `clone3` into the cgroup `dir`, as `vfork` starts
/// one: it runs on this thread's stack, below this frame, and this thread
/// waits (CLONE_VFORK) until it has called exec or exited; `shared` adds
/// CLONE_VM. `None` on any error: the caller then starts the child another
/// way, which moves into the cgroup itself and so meets (and reports) any
/// refusal of the cgroup's as before. Where `clone3` or `CLONE_INTO_CGROUP`
/// is missing (ENOSYS, E2BIG) or a filter refuses it (EPERM: the cgroup
/// checks never say that), it is not tried again.
///
/// # Safety
/// Signals must be blocked (a handler would run on the shared stack).
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_into(shared: u64, dir: BorrowedFd, args: &ChildArgs) -> Option<libc::pid_t> {
    use std::sync::atomic::Ordering;
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let clone_args = CloneArgs {
        flags: shared | libc::CLONE_VFORK as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: dir.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    let ret: i64;
    // SAFETY: clone3 with no stack of its own: the child continues on this
    // stack pointer and only goes deeper (a call, writing below this
    // frame, where the waiting parent keeps nothing) and never returns
    // here: `child_main` ends in exec or _exit (`ud2` if it ever came
    // back). The asm may push (no `nostack`: never add it, nor `nomem`,
    // `readonly` or `preserves_flags`), so the compiler keeps nothing below
    // the stack pointer and aligns it for the call. The parent gets the
    // pid, or -errno, in rax; the syscall clobbers rcx and r11.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov rdi, r13",
            "call r12",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &clone_args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") child_main as *const () as usize,
            in("r13") args as *const ChildArgs,
            lateout("rcx") _,
            lateout("r11") _,
        );
    }
    if ret > 0 {
        return Some(ret as libc::pid_t);
    }
    if [libc::ENOSYS, libc::E2BIG, libc::EPERM].contains(&(-ret as i32)) {
        CLONE3.store(false, Ordering::Relaxed);
    }
    None
}

/// Other architectures: the child moves itself into its cgroup.
///
/// # Safety
/// None needed; the signature matches the x86_64 one.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn clone3_into(_shared: u64, _dir: BorrowedFd, _args: &ChildArgs) -> Option<libc::pid_t> {
    None
}

thread_local! {
    /// The stack children started from this thread run on until `exec`,
    /// kept: unmapping it would flush the TLB of every core the daemon
    /// runs on, the cost this module avoids. One spawn at a time per thread,
    /// each over before the next (the child has called `exec` or has its
    /// own copy), so one stack is enough.
    static STACK: std::cell::RefCell<Option<Stack>> = const { std::cell::RefCell::new(None) };
}

/// Waits for the child `pid`, which has ended or is ending.
pub fn reap(pid: libc::pid_t) {
    // SAFETY: waiting for our own child; retried when a signal interrupts.
    while unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) } < 0
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
}

/// The errno the child reported, if it failed before `exec` (an `exec`
/// that succeeded closes the pipe with nothing written).
///
/// The child has called `exec` or exited when the clone returns
/// (CLONE_VFORK), so what it wrote is there: the pipe is only looked at.
/// Waiting for its end to close could wait on another spawn's child, which
/// holds a copy of the write end until its own `exec`.
fn read_report(report: &OwnedFd) -> Option<i32> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(report.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
    let mut bytes = [0u8; 4];
    let mut got = 0usize;
    while let Some(rest) = bytes.get_mut(got..).filter(|rest| !rest.is_empty()) {
        // SAFETY: reading into the unfilled part of a local buffer.
        let n = unsafe { libc::read(report.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len()) };
        match n {
            n if n > 0 => got += n as usize,
            _ if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => break, // closed, nothing (yet) written, or an error
        }
    }
    (got == bytes.len()).then(|| i32::from_ne_bytes(bytes))
}

/// The child, from the clone to `exec`: only system calls (module doc).
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the starting thread's `ChildArgs`, alive until this
    // child has called exec or exited (or copied with the memory).
    let args = unsafe { &*(arg as *const ChildArgs) };
    let errno = match run_child(args) {
        Err(e) => e.raw_os_error().unwrap_or(libc::EINVAL),
        Ok(()) => libc::EINVAL, // invariant: run_child returns only on an error
    };
    // SAFETY: a write of a local buffer to the report pipe, then the exit of
    // this child only (_exit runs nothing of the daemon's).
    unsafe {
        libc::write(args.report, errno.to_ne_bytes().as_ptr().cast(), 4);
        libc::_exit(127)
    }
}

/// The kernel's `struct sigaction` (handler first; 32 bytes covers the
/// layouts of x86_64, aarch64 and 32-bit arm), for the raw `rt_sigaction`.
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: usize,
    rest: [u64; 3],
}

/// The child's steps; returns only on an error.
fn run_child(args: &ChildArgs) -> io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    if let Some(procs) = args.enter {
        crate::process::cgroup::enter(procs)?;
    }
    // SAFETY: system calls on values prepared before the clone, or local.
    unsafe {
        // No handler of the daemon's may run here: caught signals go back to
        // their default (ignored ones stay ignored across exec, but SIGPIPE,
        // which Rust ignores, goes back to its default as `std` does). Raw
        // calls, as glibc's hide its own two signals.
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut action = KernelSigaction::default();
            let query = std::ptr::null::<KernelSigaction>();
            if libc::syscall(libc::SYS_rt_sigaction, signal, query, &mut action, 8usize) != 0 {
                continue;
            }
            let (default, ignore) = (libc::SIG_DFL, libc::SIG_IGN);
            if action.handler != default && (action.handler != ignore || signal == libc::SIGPIPE) {
                let reset = KernelSigaction::default();
                let none = std::ptr::null_mut::<KernelSigaction>();
                libc::syscall(libc::SYS_rt_sigaction, signal, &reset, none, 8usize);
            }
        }
        let unblocked: u64 = 0;
        let none = std::ptr::null_mut::<u64>();
        if libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &unblocked,
            none,
            8,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
        for (target, fd) in (0..).zip(args.stdio) {
            if fd == target {
                // Already in place: only its close-on-exec flag must go.
                check(libc::fcntl(fd, libc::F_SETFD, 0))?;
            } else {
                check(libc::dup2(fd, target))?;
            }
        }
        check(libc::chdir(args.command.cwd.as_ptr()))?;
        // A session of its own (and so a process group): it cannot join
        // the daemon's group (only groups of its own session), whose
        // priority it could then set, or whose kill it could escape.
        check(libc::setsid())?;
    }
    (args.steps)()?;
    let command = args.command;
    // SAFETY: NUL-terminated strings and NULL-terminated arrays owned by the
    // command; execve returns only on an error.
    unsafe {
        libc::execve(
            command.program.as_ptr(),
            command.argv.as_ptr(),
            command.envp.as_ptr(),
        );
        if io::Error::last_os_error().raw_os_error() == Some(libc::ENOEXEC) {
            // An executable script without `#!`: the shell runs it, as
            // `execvp` (and so `std`) does.
            libc::execve(SH.as_ptr(), command.sh_argv.as_ptr(), command.envp.as_ptr());
            return Err(io::Error::from_raw_os_error(libc::ENOEXEC));
        }
    }
    Err(io::Error::last_os_error())
}

/// A pipe, both ends close-on-exec: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A spare stack for children started by `clone`, with a guard page below;
/// one per thread, kept ([`STACK`]).
struct Stack {
    base: *mut libc::c_void,
}

impl Stack {
    fn new() -> io::Result<Stack> {
        // SAFETY: a fresh private mapping, then its lowest page made
        // inaccessible (the guard); unmapped on drop.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stack = Stack { base };
            if libc::mprotect(base, page_size(), libc::PROT_NONE) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(stack)
        }
    }

    /// Where the stack starts (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // The mapping is page-aligned and STACK_BYTES a multiple of 16.
        self.base.cast::<u8>().wrapping_add(STACK_BYTES).cast()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unused once the child has
        // called exec or exited.
        unsafe { libc::munmap(self.base, STACK_BYTES) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests;
