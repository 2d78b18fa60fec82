//! The load generator: closed-loop connections, each with one checked call
//! in flight; the list round trip, a child's own start, and n calls in
//! flight on one connection.

use super::*;

/// What a load sends, and how its answers are checked.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Call {
    /// `bench.echo` to the echo responder: the answer's data is the request's.
    Echo,
    /// `add` {a: n, b: connection}: the answer's result is {"result": a + b}.
    Add,
    /// `burn` {ms: 5}: {"spun_ms": 5}.
    Burn,
}

impl Call {
    pub(crate) fn topic(self) -> &'static str {
        match self {
            Call::Echo => "bench.echo",
            Call::Add | Call::Burn => "ovos.tools.invoke",
        }
    }

    pub(crate) fn data(self, conn: u64, n: u64) -> Value {
        match self {
            Call::Echo | Call::Add => json!({"name": "add", "args": {"a": n, "b": conn}}),
            Call::Burn => json!({"name": "burn", "args": {"ms": 5}}),
        }
    }

    pub(crate) fn check(self, sent: &Value, answer: &Value) -> Result<(), String> {
        if let Some(e) = answer.get("error") {
            return Err(format!("error answer: {e}"));
        }
        let expected = match self {
            Call::Echo if answer == sent => return Ok(()),
            Call::Echo => return Err(format!("echo {answer}, sent {sent}")),
            Call::Add => {
                let arg = |k: &str| sent["args"][k].as_u64().unwrap_or(0);
                json!({"result": arg("a") + arg("b")})
            }
            Call::Burn => json!({"spun_ms": 5}),
        };
        if answer.get("name") == sent.get("name") && answer.get("result") == Some(&expected) {
            Ok(())
        } else {
            Err(format!("answer {answer}, expected result {expected}"))
        }
    }
}

/// Failures seen while checking answers.
#[derive(Default)]
pub(crate) struct Faults {
    pub(crate) errors: u64,
    pub(crate) timeouts: u64,
    /// The first few, in words.
    pub(crate) texts: Vec<String>,
}

impl Faults {
    pub(crate) fn error(&mut self, text: String) {
        self.errors += 1;
        self.note(text);
    }

    pub(crate) fn timeout(&mut self, text: String) {
        self.timeouts += 1;
        self.note(text);
    }

    pub(crate) fn note(&mut self, text: String) {
        if self.texts.len() < 5 {
            self.texts.push(text);
        }
    }

    pub(crate) fn merge(&mut self, other: Faults) {
        self.errors += other.errors;
        self.timeouts += other.timeouts;
        for t in other.texts {
            self.note(t);
        }
    }
}

#[derive(Default)]
pub(crate) struct Connection {
    /// Of the calls sent in the window and answered correctly.
    pub(crate) latencies: Vec<Duration>,
    /// Correct answers received in the window.
    pub(crate) answered: u64,
    pub(crate) faults: Faults,
}

/// One connection of the closed loop: one request in flight until `end`.
pub(crate) async fn connection(
    url: String,
    call: Call,
    conn: u64,
    start: Instant,
    end: Instant,
) -> Connection {
    let mut out = Connection::default();
    let mut ws = match client::connect(&url).await {
        Ok(connection) => connection.ws,
        Err(e) => {
            out.faults.error(format!("connect to {url}: {e}"));
            return out;
        }
    };
    let response = format!("{}.response", call.topic());
    // Every frame carrying one of this connection's marks has this in it.
    let ours = format!("\"bench-{conn}-");
    let mut timed_out = HashSet::new();
    let mut n = 0u64;
    'calls: while Instant::now() < end {
        n += 1;
        let mark = format!("bench-{conn}-{n}");
        let data = call.data(conn, n);
        let frame = json!({"type": call.topic(), "data": data, "context": {"mark": mark}});
        let sent = Instant::now();
        if let Err(e) = ws.send(WsMessage::text(frame.to_string())).await {
            out.faults.error(format!("{mark}: send: {e}"));
            break;
        }
        let deadline = tokio::time::Instant::from_std(sent + DEADLINE);
        let answer = loop {
            let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
                Err(_) => {
                    out.faults
                        .timeout(format!("{mark}: no answer within {DEADLINE:?}"));
                    timed_out.insert(mark);
                    continue 'calls;
                }
                Ok(None) => {
                    out.faults.error(format!("{mark}: connection closed"));
                    break 'calls;
                }
                Ok(Some(Err(e))) => {
                    out.faults.error(format!("{mark}: receive: {e}"));
                    break 'calls;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            tcp::quickack(ws.get_ref());
            let WsMessage::Text(text) = frame else {
                continue;
            };
            // Cheap filter before parsing: most frames are others' traffic.
            if !text.as_str().contains(&ours) {
                continue;
            }
            let v: Value = match serde_json::from_str(text.as_str()) {
                Ok(v) => v,
                Err(e) => {
                    out.faults.error(format!("{mark}: unparseable frame: {e}"));
                    continue;
                }
            };
            if v["type"] != response.as_str() {
                continue; // our request, relayed back by the bus
            }
            let got = v["context"]["mark"].as_str().unwrap_or_default();
            if got == mark {
                break v;
            }
            // A late answer to a request already counted as timed out is not
            // counted twice; any other is a duplicate or a stranger.
            if !timed_out.remove(got) {
                out.faults
                    .error(format!("{mark}: unexpected answer marked {got:?}: {v}"));
            }
        };
        let at = Instant::now();
        match call.check(&data, &answer["data"]) {
            Ok(()) => {
                if sent >= start && sent < end {
                    out.latencies.push(at - sent);
                }
                if at >= start && at < end {
                    out.answered += 1;
                }
            }
            Err(e) => out.faults.error(format!("{mark}: {e}")),
        }
    }
    close(ws).await;
    out
}

/// CPU of the service's tree and of the bus, at one instant.
pub(crate) type CpuSample = anyhow::Result<(procfs::Cpu, Option<procfs::Cpu>)>;

pub(crate) fn sample_cpu(service: u32, bus: Option<u32>) -> CpuSample {
    Ok((procfs::cpu(service)?, bus.map(procfs::cpu).transpose()?))
}

/// Results of one closed-loop run.
pub(crate) struct LoadResult {
    pub(crate) answered: u64,
    pub(crate) latencies: Vec<Duration>,
    pub(crate) faults: Faults,
    /// CPU used in the window: the service's tree, its own part, the bus.
    pub(crate) cpu: anyhow::Result<(procfs::Cpu, Option<Duration>)>,
}

/// `conns` connections, each with one request in flight, for RUN after WARMUP;
/// the CPU of `service`'s tree and of `bus` is sampled at the window's ends.
pub(crate) async fn load(
    url: &str,
    call: Call,
    conns: usize,
    service: u32,
    bus: Option<u32>,
) -> LoadResult {
    let start = Instant::now() + WARMUP;
    let end = start + RUN;
    let sampler = cpu_in_window(start, end, service, bus);
    let tasks: Vec<_> = (0..conns as u64)
        .map(|c| tokio::spawn(connection(url.to_owned(), call, c, start, end)))
        .collect();
    gather(tasks, sampler).await
}

/// The CPU of `service`'s tree and of `bus` used between `start` and `end`,
/// sampled at both ends.
pub(crate) fn cpu_in_window(
    start: Instant,
    end: Instant,
    service: u32,
    bus: Option<u32>,
) -> tokio::task::JoinHandle<anyhow::Result<(procfs::Cpu, Option<Duration>)>> {
    tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        let before = tokio::task::spawn_blocking(move || sample_cpu(service, bus)).await;
        tokio::time::sleep_until(end.into()).await;
        let after = tokio::task::spawn_blocking(move || sample_cpu(service, bus)).await;
        let (before, after) = (
            before.expect("the CPU sampler panicked")?,
            after.expect("the CPU sampler panicked")?,
        );
        let service = procfs::Cpu {
            tree: after.0.tree.saturating_sub(before.0.tree),
            own: after.0.own.saturating_sub(before.0.own),
        };
        let bus = after
            .1
            .zip(before.1)
            .map(|(a, b)| a.tree.saturating_sub(b.tree));
        anyhow::Ok((service, bus))
    })
}

/// The connections' results, together, with the CPU of the window.
pub(crate) async fn gather(
    tasks: Vec<tokio::task::JoinHandle<Connection>>,
    sampler: tokio::task::JoinHandle<anyhow::Result<(procfs::Cpu, Option<Duration>)>>,
) -> LoadResult {
    let mut result = LoadResult {
        answered: 0,
        latencies: Vec::new(),
        faults: Faults::default(),
        cpu: Err(anyhow::anyhow!("not sampled")),
    };
    for t in tasks {
        let c = t.await.expect("a load connection panicked");
        result.answered += c.answered;
        result.latencies.extend(c.latencies);
        result.faults.merge(c.faults);
    }
    result.cpu = sampler.await.expect("the CPU sampler panicked");
    result.latencies.sort();
    result
}

/// Closes a connection cleanly: the stock Python bus drops *other* clients
/// when one resets its connection abruptly.
pub(crate) async fn close(mut ws: client::WsStream) {
    let _ = ws.close(None).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// `ovos.tools.list` 21 times (the first as a warm-up): the median round trip,
/// the number of tools listed and when the first answer came.
pub(crate) async fn list_round_trip(url: &str) -> Result<(Duration, usize, Instant), String> {
    let mut ws = client::connect(url)
        .await
        .map_err(|e| format!("connect: {e}"))?
        .ws;
    let mut times = Vec::new();
    let mut tools = 0;
    let mut first = None;
    for i in 0..21 {
        let mark = format!("list-{i}");
        let sent = Instant::now();
        ws.send(WsMessage::text(
            json!({"type": "ovos.tools.list", "data": {}, "context": {"mark": mark}}).to_string(),
        ))
        .await
        .map_err(|e| format!("send: {e}"))?;
        let deadline = tokio::time::Instant::from_std(sent + DEADLINE);
        loop {
            let frame = tokio::time::timeout_at(deadline, ws.next())
                .await
                .map_err(|_| format!("{mark}: no answer within {DEADLINE:?}"))?
                .ok_or("connection closed")?
                .map_err(|e| format!("receive: {e}"))?;
            tcp::quickack(ws.get_ref());
            let WsMessage::Text(text) = frame else {
                continue;
            };
            // A full parse of the answer, without building a tree of it.
            #[derive(Deserialize)]
            struct Answer {
                #[serde(rename = "type")]
                topic: String,
                data: Tools,
                context: Value,
            }
            #[derive(Deserialize)]
            struct Tools {
                tools: Option<Vec<serde::de::IgnoredAny>>,
                error: Option<Value>,
            }
            let Ok(a) = serde_json::from_str::<Answer>(text.as_str()) else {
                continue;
            };
            if a.topic == "ovos.tools.list.response" && a.context["mark"] == mark.as_str() {
                if let Some(e) = a.data.error {
                    return Err(format!("{mark}: error answer: {e}"));
                }
                tools = a
                    .data
                    .tools
                    .ok_or(format!("{mark}: no tools in the answer"))?
                    .len();
                break;
            }
        }
        first.get_or_insert_with(Instant::now);
        if i > 0 {
            times.push(sent.elapsed());
        }
    }
    close(ws).await;
    times.sort();
    let first = first.ok_or("no answer")?;
    Ok((times[times.len() / 2], tools, first))
}

/// A child's own start: spawn, initialize, every page of tools/list. Returns
/// the time and the number of tools.
pub(crate) fn child_startup(command: &str, args: &[&str], cwd: &Path) -> (Duration, usize) {
    let started = Instant::now();
    let mut child = Command::new(command)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command}: {e}"));
    let mut stdin = child.stdin.take().expect("piped stdin");
    let send = |stdin: &mut std::process::ChildStdin, msg: Value| {
        writeln!(stdin, "{msg}").unwrap_or_else(|e| panic!("writing to {command}: {e}"));
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "bench", "version": "0"}}}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}),
    );
    let mut tools = 0;
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    while let Some(Ok(line)) = lines.next() {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = v["id"].as_u64().filter(|&id| id >= 2) else {
            continue;
        };
        tools += v["result"]["tools"].as_array().map_or(0, Vec::len);
        match v["result"]["nextCursor"].as_str() {
            Some(cursor) => send(
                &mut stdin,
                json!({"jsonrpc": "2.0", "id": id + 1, "method": "tools/list",
                       "params": {"cursor": cursor}}),
            ),
            None => break,
        }
    }
    let took = started.elapsed();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    (took, tools)
}

/// `n` concurrent `sleep` calls of `ms` on one connection: the time until the
/// last correct answer, and the failures.
pub(crate) async fn concurrent(url: &str, n: usize, ms: u64) -> (Option<Duration>, Faults) {
    let mut faults = Faults::default();
    let mut ws = match client::connect(url).await {
        Ok(connection) => connection.ws,
        Err(e) => {
            faults.error(format!("connect: {e}"));
            return (None, faults);
        }
    };
    let started = Instant::now();
    let mut pending = HashSet::new();
    for i in 0..n {
        let mark = format!("conc-{i}");
        let frame = json!({"type": "ovos.tools.invoke", "data": {"name": "sleep", "args": {"ms": ms}}, "context": {"mark": mark}});
        if let Err(e) = ws.send(WsMessage::text(frame.to_string())).await {
            faults.error(format!("{mark}: send: {e}"));
            return (None, faults);
        }
        pending.insert(mark);
    }
    let deadline = tokio::time::Instant::from_std(started + DEADLINE);
    let expected = json!({"slept_ms": ms});
    while !pending.is_empty() {
        let frame = match tokio::time::timeout_at(deadline, ws.next()).await {
            Err(_) => {
                faults.timeouts += pending.len() as u64;
                faults.note(format!(
                    "{} calls unanswered within {DEADLINE:?}",
                    pending.len()
                ));
                break;
            }
            Ok(None) => {
                faults.error("connection closed".into());
                break;
            }
            Ok(Some(Err(e))) => {
                faults.error(format!("receive: {e}"));
                break;
            }
            Ok(Some(Ok(frame))) => frame,
        };
        tcp::quickack(ws.get_ref());
        let WsMessage::Text(text) = frame else {
            continue;
        };
        if !text.as_str().contains("\"conc-") {
            continue;
        }
        let Ok(v) = serde_json::from_str::<Value>(text.as_str()) else {
            faults.error("unparseable frame".into());
            continue;
        };
        if v["type"] != "ovos.tools.invoke.response" {
            continue;
        }
        let mark = v["context"]["mark"].as_str().unwrap_or_default();
        if !pending.remove(mark) {
            faults.error(format!("unexpected answer marked {mark:?}"));
        } else if v["data"].get("error").is_some() || v["data"]["result"] != expected {
            faults.error(format!(
                "{mark}: answer {}, expected result {expected}",
                v["data"]
            ));
        }
    }
    let took = started.elapsed();
    close(ws).await;
    (pending.is_empty().then_some(took), faults)
}
