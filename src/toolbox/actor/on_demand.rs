//! The actor's on-demand starts (`[start]`): a lazy toolbox listed from its
//! cached catalog with no child, the one listing start of a lazy toolbox
//! without one, and a child stopped after `idle_stop_s` without a call.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::SemaphorePermit;

use super::turns::{ListingTurn, LISTING_TURNS};
use super::{Actor, Mode, Reply, View};
use crate::tool::ToolSet;
use crate::toolbox::running::{drain_and_stop, Running};

impl Actor {
    /// Stops the serving child if no call has used it for its idle limit;
    /// the toolbox stays listed, as `idle`.
    pub(super) async fn idle_check(&mut self, mut running: Running) -> Mode {
        running.idle_due = None;
        let Some(limit) = running.idle_stop else {
            return Mode::Serving(running);
        };
        let serving = &running.serving;
        // Calls waiting for a slot (woken by this child, not yet on it)
        // keep it too.
        let waiting = self
            .stats
            .in_flight
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0;
        if serving.busy() || waiting || serving.last_active().elapsed() < limit {
            // In use: a listing start's turn goes to the next toolbox.
            running.listing_turn = None;
            return Mode::Serving(running);
        }
        // A wake rung before now came from a caller that found the last
        // child idle, and was answered by this one: forget it. (Callers
        // ring only once they see the slot idle, which is published next.)
        let _ = futures_util::FutureExt::now_or_never(self.wake.notified());
        running.idle_stop = None;
        let pid = running.child.pid();
        tracing::info!(
            toolbox = self.id(),
            pid,
            idle_s = limit.as_secs(),
            "no call for idle_stop_s; stopping the child (the next call starts one)"
        );
        self.show(View::Idle, None);
        drain_and_stop(running, &self.manifest).await;
        Mode::Idle
    }

    /// The first start, or a start into a changed manifest: a lazy toolbox
    /// is listed from its cached catalog and starts no child (without a
    /// cache, one child is started to list its tools, and stopped as soon
    /// as no call uses it); any other starts its child.
    pub(super) async fn begin(&mut self, reply: Option<Reply>) -> Mode {
        self.awaiting_listing = false;
        if self.manifest.start.mode != crate::manifest::StartMode::Lazy {
            return self.start(reply).await;
        }
        if let Some(mode) = self.list_from_cache() {
            if let Some(reply) = reply {
                let _ = reply.send(Ok(
                    "idle: listed from its cached catalog; its first call starts it".to_owned(),
                ));
            }
            return mode;
        }
        if reply.is_some() {
            // An operator's start: this one toolbox, now.
            return self.list_once(reply, None).await;
        }
        // At the daemon's start or a reload: in turn with the others.
        self.awaiting_listing = true;
        self.show(View::Starting, None);
        Mode::Idle
    }

    /// The start after a backoff or a failed cool-down: a lazy toolbox
    /// goes back to idle (listed from its cache, or waiting for its turn to
    /// list), any other starts its child.
    pub(super) async fn start_again(&mut self) -> Mode {
        if self.manifest.start.mode == crate::manifest::StartMode::Lazy {
            return self.begin(None).await;
        }
        self.start(None).await
    }

    /// Its turn to start once and list its tools, while it waits for one (a future for the
    /// actor's event loop).
    pub(super) fn listing_turn(
        &self,
        mode: &Mode,
    ) -> Option<impl std::future::Future<Output = ListingTurn> + 'static> {
        (self.awaiting_listing && matches!(mode, Mode::Idle)).then(|| LISTING_TURNS.acquire())
    }

    /// Starts the child of a lazy toolbox with no cached catalog to list its
    /// tools (which caches them), and stops it as soon as no call uses it.
    pub(super) async fn list_once(
        &mut self,
        reply: Option<Reply>,
        turn: Option<SemaphorePermit<'static>>,
    ) -> Mode {
        tracing::info!(
            toolbox = self.id(),
            "lazy toolbox with no cached catalog: starting it once to list its tools"
        );
        match self.start(reply).await {
            Mode::Serving(mut running) => {
                running.idle_stop = Some(Duration::ZERO);
                running.listing_turn = turn;
                Mode::Serving(running)
            }
            other => other,
        }
    }

    /// An idle toolbox asked to refresh its tools (a reload that left its
    /// manifest unchanged): if its cached catalog no longer holds (its
    /// executable or script changed), it waits for its turn to list them
    /// again, still listed with the old ones meanwhile.
    pub(super) fn recheck_cache(&mut self) {
        if self.awaiting_listing || crate::catalog_cache::load(&self.manifest).is_some() {
            return;
        }
        tracing::info!(
            toolbox = self.id(),
            "its cached catalog no longer holds (its executable or script changed): \
             starting it once to list its tools"
        );
        self.awaiting_listing = true;
    }

    /// Lists the toolbox from its cached catalog, idle; `None` when no
    /// cache holds for this manifest (or its tools no longer compile).
    fn list_from_cache(&mut self) -> Option<Mode> {
        let mut cached = crate::catalog_cache::load(&self.manifest)?;
        self.manifest.annotations.apply(&mut cached.tools);
        let fingerprint = crate::mcp::tools_fingerprint(&cached.tools);
        let (tools, rejected) = ToolSet::compile(&self.manifest.id, cached.tools);
        if tools.fits_on_the_bus().is_err() {
            return None;
        }
        // Left out as when the child listed them (and said then).
        for problem in rejected {
            tracing::debug!(toolbox = self.id(), "cached tool left out: {problem}");
        }
        tracing::info!(
            toolbox = self.id(),
            tools = tools.len(),
            "lazy toolbox listed from its cached catalog; no child until its first call"
        );
        if self.manifest.protocol.is_none() {
            self.pin = Some(cached.version);
        }
        self.last_specs = Some(fingerprint);
        self.show(View::Idle, Some(Arc::new(tools)));
        Some(Mode::Idle)
    }
}
