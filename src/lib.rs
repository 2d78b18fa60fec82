//! toolboxd supervises agent toolboxes — child processes speaking MCP over
//! stdio — and serves their tools on the OVOS messagebus (OVOS-TOOLS-1).
//!
//! Map of the modules, from the outside in:
//!
//! - [`daemon`]: `toolboxd run` as its phases (find the bus, start up, serve,
//!   shut down), wiring the pieces below together; signals.
//! - [`bus`]: the OVOS-MSG-1 [`bus::envelope`], the daemon's
//!   [`bus::client`] (reconnecting, or in process on the bus it serves), the
//!   embedded [`bus::server`], socket options.
//! - [`service`]: the bus face: where each OVOS-TOOLS-1 request is
//!   answered; calls decoded, sent through the pipeline, their outcomes
//!   worded; a call's progress relayed to its caller within a rate.
//! - [`mcp_face`]: `toolboxd mcp`, the MCP server face: the bus's tool
//!   catalog served to MCP clients (stdio, streamable HTTP), each call
//!   relayed to the bus.
//! - [`pipeline`]: the call pipeline every face uses: a request admitted as
//!   a [`call::Call`], run to one typed outcome, every ending reported;
//!   every text a caller reads (`pipeline/texts.rs`).
//! - [`observe`]: how a finished call ended, reported in one place to the
//!   metrics (Prometheus, `--metrics`) and the audit log (`--audit-log`),
//!   its sinks below it.
//! - [`peers`]: the multi-host check: which toolbox ids other hosts on the
//!   bus already answer for.
//! - [`operator`]: the operator channel: the operations (status, logs, reload,
//!   restart, stop, start), their wire names, and the one place they are
//!   carried out, whether asked by the control socket, SIGHUP or the bus.
//! - [`cancel`]: the global stop: calls in flight by session, and the
//!   token a stop cancels each with.
//! - [`registry`]: the catalog of hosted toolboxes and their tools.
//! - [`tool`]: one tool's bus definition (kept serialized) and its schema validators (compiled at its first call).
//! - [`supervisor`]: the set of toolbox actors; manifest reload as a diff.
//! - [`toolbox`]: one actor per toolbox; where a child is started, probed,
//!   restarted and stopped, and where calls wait for a child.
//! - [`catalog_cache`]: the tool lists of lazy and idle toolboxes on disk,
//!   so they are listed with no process running.
//! - [`call`]: one call as every layer reads it: what was asked, its
//!   toolbox, its one deadline, its cancel token and progress sink.
//! - [`ask`]: asking the person behind a call on the bus
//!   (`ovos.tools.ask`): a confirmation before a side effect, a child's
//!   own question; the first valid answer decides.
//! - [`launch`]: one way to start a child: spawn, era, tools (for `run` and
//!   `check --probe` alike).
//! - [`session`]: the MCP conversation with one child (era, tools, calls).
//! - [`process`]: one child process and what it runs in: its stdio and
//!   request multiplexing ([`process::child`]), its confinement
//!   ([`process::sandbox`]), its cgroup, the keeper that makes everything a
//!   toolbox started die with the daemon, and what its tree uses (/proc).
//! - [`mcp`]: JSON-RPC and MCP model types (pure).
//! - [`protocol`]: what the protocols fix: bus topics and their routing, the
//!   toolbox id grammar (a leaf).
//! - [`manifest`]: TOML manifests: parse, validate, resolve.
//! - [`control`]: the control socket (one door to the operator channel) and
//!   its client, `toolboxd ctl`.
//! - [`cli`]: the `check`, `list`, `call` and `new` commands.
//! - [`notify`]: systemd readiness and watchdog notifications.
//! - [`util`]: reading operator files without trusting what is at the path,
//!   a per-second budget for log lines from outside the daemon, wall-clock
//!   times as operators read them, `or_never` for `select!`.
//! - [`shutdown`]: the shutdown signal shared by long-running tasks.
//!
//! The directory tree is the layering: a module uses only the layers below
//! it (docs/architecture.md, checked by tests/layers.rs).

pub(crate) mod ask;
pub mod bus;
pub mod call;
pub(crate) mod cancel;
pub(crate) mod catalog_cache;
pub mod cli;
pub mod control;
pub mod daemon;
pub(crate) mod launch;
pub mod manifest;
pub mod mcp;
pub mod mcp_face;
pub(crate) mod notify;
pub(crate) mod observe;
pub mod operator;
pub(crate) mod peers;
pub mod pipeline;
pub mod process;
pub(crate) mod protocol;
pub mod registry;
pub(crate) mod service;
pub(crate) mod session;
pub mod shutdown;
pub(crate) mod supervisor;
pub mod tool;
pub(crate) mod toolbox;
pub mod util;
