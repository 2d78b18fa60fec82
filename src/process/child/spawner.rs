//! Where children are started: a few threads that live as long as the
//! daemon, beside the runtime's thread.
//!
//! A spawn is slow for an event loop: the sandbox plan takes a few hundred
//! system calls, and the starting thread then waits until the child has
//! entered its cgroups, applied Landlock and seccomp and called `exec`
//! (about 1 ms in all; child/exec.rs). On the runtime's one thread, twenty
//! toolboxes starting together stalled every call for the sum, one after
//! another. Here spawns run beside the calls, [`THREADS`] at a time.
//!
//! The threads never exit, and survive a panicking job: a child's
//! parent-death signal fires when the *thread* that started it exits, and
//! must fire only with the daemon.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// Spawner threads: two spawns overlap (one child's set-up while the
/// other's plan is made) without taking more of a small device's cores.
const THREADS: usize = 2;

/// One spawn, to run on a spawner thread.
type Job = Box<dyn FnOnce() + Send>;

/// The spawner threads' queue; `None` when no thread could be started (jobs
/// then run on the caller's thread).
static JOBS: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();

/// Runs `job` on a spawner thread and returns its result; `None` if the job
/// panicked. Without spawner threads (none could be started), runs it here.
pub async fn run<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(job());
    });
    match queue() {
        Some(queue) => {
            // A poisoned lock only means a sender panicked between two
            // plain moves: the channel itself is whole.
            let sent = queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .send(job);
            if let Err(mpsc::SendError(job)) = sent {
                job();
            }
        }
        None => job(),
    }
    rx.await.ok()
}

/// The queue, with its threads started on first use.
fn queue() -> Option<&'static Mutex<mpsc::Sender<Job>>> {
    JOBS.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut started = 0;
        for n in 0..THREADS {
            let rx = rx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("toolboxd-spawn-{n}"))
                .spawn(move || serve(&rx));
            match thread {
                Ok(_) => started += 1,
                Err(e) => tracing::warn!("cannot start a spawner thread: {e}"),
            }
        }
        (started > 0).then(|| Mutex::new(tx))
    })
    .as_ref()
}

/// A spawner thread's loop: one job at a time, until the process ends.
fn serve(jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let next = jobs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .recv();
        let Ok(job) = next else {
            // invariant: the sender lives in a static, so this never comes;
            // if it did, stay alive anyway (see the module's note).
            std::thread::park();
            continue;
        };
        // A panic drops the job's answer (its caller sees `None`) and not
        // this thread.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}
