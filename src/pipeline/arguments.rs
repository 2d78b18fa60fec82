//! A call's arguments checked against its tool's schema, without ever
//! stalling the daemon: small ones at once, large ones bounded in size and
//! checked on a blocking thread, one at a time, under a time budget.

use std::sync::Arc;
use std::time::Duration;

use super::texts;
use crate::call::Call;
use crate::tool::Tool;

/// Frames up to this size have arguments small enough to validate on the
/// runtime thread (even a quadratic pattern costs little); larger ones are
/// validated on a blocking thread under [`VALIDATION_BUDGET`].
const INLINE_VALIDATION_BYTES: usize = 4 * 1024;
/// How long a large argument's validation may take, its wait for the
/// validation thread included.
const VALIDATION_BUDGET: Duration = Duration::from_secs(2);
/// Large validations run one at a time, so they can take at most one core.
static VALIDATING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Checks a call's arguments against the tool's schema (the toolbox has
/// bounded their size when it admitted the call). Arguments from a small
/// message are checked here, at once; larger ones on a blocking thread, one
/// at a time, within [`VALIDATION_BUDGET`], so that no argument and no
/// pattern in a schema can stall the daemon. `Err`: why they fail.
pub(super) async fn check_arguments(tool: &Arc<Tool>, call: &mut Call) -> Result<(), String> {
    if call.request.bytes <= INLINE_VALIDATION_BYTES {
        return tool.check_arguments(&call.request.arguments);
    }
    // Its validators compiled here, on this thread (as when it was listed),
    // so that no call waits for a blocking thread to compile them.
    tool.prepare()?;
    // Checked on another thread, and given back.
    let args = std::mem::take(&mut call.request.arguments);
    let tool = tool.clone();
    let checked = async move {
        // Held by the blocking thread until it is done, even past the budget.
        let turn = VALIDATING.acquire().await.ok()?;
        let run = move || {
            let _turn = turn;
            let checked = tool.check_arguments(&args);
            (checked, args)
        };
        tokio::task::spawn_blocking(run).await.ok()
    };
    match tokio::time::timeout(VALIDATION_BUDGET, checked).await {
        Ok(Some((checked, args))) => {
            call.request.arguments = args;
            checked
        }
        Ok(None) => Err(texts::VALIDATION_NOT_RUN.to_owned()),
        Err(_) => Err(texts::validation_too_slow(VALIDATION_BUDGET)),
    }
}
