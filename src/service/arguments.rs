//! A call's arguments checked against its tool's schema, without ever
//! stalling the daemon: small ones at once, large ones bounded in size and
//! checked on a blocking thread, one at a time, under a time budget.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::Arrival;
use crate::tool::Tool;
use crate::toolbox::ToolboxHandle;

/// Frames up to this size have arguments small enough to validate on the
/// runtime thread (even a quadratic pattern costs little); larger ones are
/// validated on a blocking thread under [`VALIDATION_BUDGET`].
const INLINE_VALIDATION_BYTES: usize = 4 * 1024;
/// How long a large argument's validation may take, its wait for the
/// validation thread included.
const VALIDATION_BUDGET: Duration = Duration::from_secs(2);
/// Large validations run one at a time, so they can take at most one core.
static VALIDATING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Checks a call's arguments against the tool's schema; gives them back if
/// they pass. Arguments from a small frame are checked here, at once; larger
/// ones must be within `max_argument_bytes` and are checked on a blocking
/// thread, one at a time, within [`VALIDATION_BUDGET`] — so that no argument
/// and no pattern in a schema can stall the daemon.
pub(super) async fn check_arguments(
    handle: &ToolboxHandle,
    tool: &Arc<Tool>,
    args: Value,
    arrived: &Arrival,
) -> Result<Value, String> {
    if arrived.frame_bytes <= INLINE_VALIDATION_BYTES {
        return tool.check_arguments(&args).map(|()| args);
    }
    let bytes = json_bytes(&args);
    let max = handle.max_argument_bytes();
    if bytes > max {
        return Err(format!(
            "the arguments are {bytes} bytes, more than max_argument_bytes ({max})"
        ));
    }
    // Its validators compiled here, on this thread (as when it was listed),
    // so that no call waits for a blocking thread to compile them.
    tool.prepare()?;
    let tool = tool.clone();
    let checked = async move {
        // Held by the blocking thread until it is done, even past the budget.
        let turn = VALIDATING.acquire().await.ok()?;
        let run = move || {
            let _turn = turn;
            let checked = tool.check_arguments(&args);
            checked.map(|()| args)
        };
        tokio::task::spawn_blocking(run).await.ok()
    };
    match tokio::time::timeout(VALIDATION_BUDGET, checked).await {
        Ok(Some(checked)) => checked,
        Ok(None) => Err("the validation could not run; try again".to_owned()),
        Err(_) => Err(format!(
            "validating the arguments took longer than {} s; send smaller arguments",
            VALIDATION_BUDGET.as_secs()
        )),
    }
}

/// The length of `value` as compact JSON, without building the text.
fn json_bytes(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}
