//! MCP tasks, as data: which tools may run as tasks, what a server offers,
//! and the task objects it answers with (docs/protocol.md, "Tasks").
//!
//! Two specifications, one per era:
//! - legacy, from `2025-11-25`: a server declares `tasks.requests.tools.call`
//!   in its `initialize` capabilities; a tool says `execution.taskSupport`;
//!   the client adds `task: {ttl}` to `tools/call` and gets
//!   `{task: {taskId, status, ...}}`, then `tasks/result` waits for the result;
//! - modern (`2026-07-28`), the `io.modelcontextprotocol/tasks` extension: the
//!   client declares the extension in a request's capabilities and the server
//!   may answer with `{resultType: "task", taskId, status, ...}`; `tasks/get`
//!   carries the result once the task is `completed`.

use std::time::Duration;

use serde_json::Value;

/// The extension identifier of modern-era tasks.
pub const TASKS_EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The first legacy version that has tasks.
const FIRST_LEGACY_TASKS_VERSION: &str = "2025-11-25";

/// How a tool may be called as a task (`execution.taskSupport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskSupport {
    /// Never as a task (also what an absent or unknown value means).
    #[default]
    Forbidden,
    /// Either way.
    Optional,
    /// Only as a task: a plain call is refused with "method not found".
    Required,
}

/// The `execution.taskSupport` of one listed tool (a `tools/list` entry).
pub fn task_support(tool: &Value) -> TaskSupport {
    match tool
        .get("execution")
        .and_then(|e| e.get("taskSupport"))
        .and_then(Value::as_str)
    {
        Some("required") => TaskSupport::Required,
        Some("optional") => TaskSupport::Optional,
        _ => TaskSupport::Forbidden,
    }
}

/// What a legacy server offers for task-augmented `tools/call`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LegacyTasks {
    /// `tasks.cancel`: whether `tasks/cancel` may be sent.
    pub cancel: bool,
}

/// What the legacy session negotiated (`version`, the server's
/// `capabilities`) offers for tasks: `None` unless the version has tasks and
/// the server declares `tasks.requests.tools.call`.
pub fn legacy_tasks(version: &str, capabilities: &Value) -> Option<LegacyTasks> {
    // Versions are dates, YYYY-MM-DD: they order as strings.
    if version < FIRST_LEGACY_TASKS_VERSION {
        return None;
    }
    let tasks = capabilities.get("tasks")?;
    tasks
        .get("requests")
        .and_then(|r| r.get("tools"))
        .and_then(|t| t.get("call"))
        .filter(|c| c.is_object())?;
    Some(LegacyTasks {
        cancel: tasks.get("cancel").is_some_and(Value::is_object),
    })
}

/// A task's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskStatus {
    /// Running.
    Working,
    /// Waiting for input from the client, which a bus call cannot give.
    InputRequired,
    /// Done; the result is there.
    Completed,
    /// Ended with an error.
    Failed,
    /// Cancelled (by the client or the server).
    Cancelled,
}

impl TaskStatus {
    fn parse(text: &str) -> Option<TaskStatus> {
        Some(match text {
            "working" => TaskStatus::Working,
            "input_required" => TaskStatus::InputRequired,
            "completed" => TaskStatus::Completed,
            "failed" => TaskStatus::Failed,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }

    /// Whether the task has ended (its result or error is final).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }
}

/// What a task object says, in either era.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskState {
    /// The server's id of the task, for `tasks/get`, `tasks/result`, `tasks/cancel`.
    pub id: String,
    /// Where it stands. An unknown status reads as `working`: the task is
    /// polled until it ends or the call's deadline passes.
    pub status: TaskStatus,
    /// `statusMessage`: the server's words on the status (why it failed or
    /// was cancelled).
    pub message: Option<String>,
    /// `pollInterval` (legacy) or `pollIntervalMs` (modern): how often the
    /// server asks to be polled.
    pub poll_interval: Option<Duration>,
}

/// Reads a task object (`Task`, or `Result & Task` in the modern era).
pub fn task_state(task: &Value) -> Option<TaskState> {
    let id = task.get("taskId")?.as_str()?.to_owned();
    let status = task
        .get("status")
        .and_then(Value::as_str)
        .map_or(TaskStatus::Working, |s| {
            TaskStatus::parse(s).unwrap_or(TaskStatus::Working)
        });
    let poll_interval = task
        .get("pollIntervalMs")
        .or_else(|| task.get("pollInterval"))
        .and_then(Value::as_u64)
        .map(Duration::from_millis);
    Some(TaskState {
        id,
        status,
        message: task
            .get("statusMessage")
            .and_then(Value::as_str)
            .map(str::to_owned),
        poll_interval,
    })
}

/// The task a `tools/call` result created, if it is a `CreateTaskResult`:
/// `{task: {...}}` (legacy) or `{resultType: "task", ...}` (modern).
/// `Some(Err)` is a `CreateTaskResult` without a usable task.
pub fn created_task(result: &Value, modern: bool) -> Option<Result<TaskState, String>> {
    let task = if modern {
        (result.get("resultType").and_then(Value::as_str) == Some("task")).then_some(result)?
    } else {
        // A CallToolResult has `content`; a CreateTaskResult has `task`.
        result
            .get("task")
            .filter(|t| t.is_object() && result.get("content").is_none())?
    };
    Some(task_state(task).ok_or_else(|| {
        "the toolbox answered with a task that has no taskId (CreateTaskResult)".to_owned()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_task_support_of_a_tool() {
        let tool = |v: Value| json!({"name": "t", "execution": {"taskSupport": v}});
        assert_eq!(
            task_support(&tool(json!("required"))),
            TaskSupport::Required
        );
        assert_eq!(
            task_support(&tool(json!("optional"))),
            TaskSupport::Optional
        );
        assert_eq!(
            task_support(&tool(json!("forbidden"))),
            TaskSupport::Forbidden
        );
        assert_eq!(task_support(&tool(json!(7))), TaskSupport::Forbidden);
        assert_eq!(task_support(&json!({"name": "t"})), TaskSupport::Forbidden);
    }

    #[test]
    fn legacy_tasks_need_the_version_and_the_capability() {
        let caps = json!({"tasks": {"cancel": {}, "requests": {"tools": {"call": {}}}}});
        assert_eq!(
            legacy_tasks("2025-11-25", &caps),
            Some(LegacyTasks { cancel: true })
        );
        assert_eq!(legacy_tasks("2025-06-18", &caps), None, "before tasks");
        let no_cancel = json!({"tasks": {"requests": {"tools": {"call": {}}}}});
        assert_eq!(
            legacy_tasks("2025-11-25", &no_cancel),
            Some(LegacyTasks { cancel: false })
        );
        let other_requests = json!({"tasks": {"cancel": {}, "requests": {"sampling": {}}}});
        assert_eq!(legacy_tasks("2025-11-25", &other_requests), None);
        assert_eq!(legacy_tasks("2025-11-25", &json!({"tools": {}})), None);
    }

    #[test]
    fn reads_tasks_of_either_era() {
        let legacy = json!({"task": {"taskId": "a1", "status": "working",
                                     "pollInterval": 1000, "statusMessage": "Gathering"}});
        assert_eq!(
            created_task(&legacy, false),
            Some(Ok(TaskState {
                id: "a1".into(),
                status: TaskStatus::Working,
                message: Some("Gathering".into()),
                poll_interval: Some(Duration::from_secs(1)),
            }))
        );
        // A plain CallToolResult creates no task, in either era.
        let plain = json!({"content": [], "isError": false});
        assert_eq!(created_task(&plain, false), None);
        assert_eq!(created_task(&plain, true), None);
        let modern = json!({"resultType": "task", "taskId": "b2", "status": "completed",
                            "pollIntervalMs": 50});
        let state = created_task(&modern, true).unwrap().unwrap();
        assert_eq!(
            (state.id.as_str(), state.status, state.poll_interval),
            ("b2", TaskStatus::Completed, Some(Duration::from_millis(50)))
        );
        // The modern shape means nothing to a legacy session, and back.
        assert_eq!(created_task(&modern, false), None);
        assert_eq!(created_task(&legacy, true), None);
        assert!(matches!(
            created_task(&json!({"resultType": "task"}), true),
            Some(Err(_))
        ));
        let odd = task_state(&json!({"taskId": "c", "status": "pondering"})).unwrap();
        assert_eq!(
            odd.status,
            TaskStatus::Working,
            "unknown status: keep polling"
        );
        assert!(TaskStatus::Cancelled.is_terminal() && !TaskStatus::InputRequired.is_terminal());
    }
}
