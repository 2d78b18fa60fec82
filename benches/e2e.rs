//! End-to-end benchmark, side by side in one run: toolboxd against a bare echo
//! responder on the same bus (the physical limit), against the Python tool
//! service it replaces, and the embedded bus against the stock Python bus.
//! Run it with `scripts/bench` (it builds what it needs and prepares .venv).
//!
//! Every figure is measured here, now; the ratios are what to read.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use toolboxd::bus::envelope::Message;
use toolboxd::bus::{client, tcp};

const TOOLBOXD: &str = env!("CARGO_BIN_EXE_toolboxd");
/// Measured time per load run, after a warm-up.
const RUN: Duration = Duration::from_secs(2);
const WARMUP: Duration = Duration::from_millis(300);

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn echo_child() -> PathBuf {
    let path = root().join("target/release/examples/echo_toolbox");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

fn venv_python() -> PathBuf {
    let path = root().join(".venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run scripts/bench",
        path.display()
    );
    path
}

/// A child process killed on drop.
struct Proc(Child);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for a line containing `needle` on `stream`, then drains it in the background.
fn wait_line(stream: impl std::io::Read + Send + 'static, needle: &str) -> String {
    let mut lines = BufReader::new(stream).lines();
    let found = lines
        .by_ref()
        .map_while(Result::ok)
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("never saw {needle:?}"));
    std::thread::spawn(move || lines.for_each(drop));
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("toolboxd-bench-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn embedded_bus() -> (Proc, String) {
    let port = free_port();
    let mut child = Command::new(TOOLBOXD)
        .args(["bus", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(child.stderr.take().unwrap(), "messagebus listening");
    (Proc(child), format!("ws://127.0.0.1:{port}/core"))
}

/// The stock Python ovos-messagebus; its port comes from mycroft.conf.
fn python_bus() -> (Proc, String, PathBuf) {
    let port = free_port();
    let home = tempdir("xdg");
    std::fs::create_dir_all(home.join("mycroft")).unwrap();
    std::fs::write(
        home.join("mycroft/mycroft.conf"),
        json!({"websocket": {"host": "127.0.0.1", "port": port, "route": "/core", "ssl": false}})
            .to_string(),
    )
    .unwrap();
    let child = Command::new(venv_python())
        .args(["-m", "ovos_messagebus"])
        .env("XDG_CONFIG_HOME", &home)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the Python bus did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Proc(child), format!("ws://127.0.0.1:{port}/core"), home)
}

fn port_of(url: &str) -> String {
    url.rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches("/core")
        .to_owned()
}

/// toolboxd on `url` with the manifests in `dir`; returns once it is ready.
fn daemon(url: &str, dir: &Path) -> (Proc, Duration) {
    let started = Instant::now();
    let mut child = Command::new(TOOLBOXD)
        .args(["--log-format", "json", "run", "--bus", url, "--manifests"])
        .arg(dir)
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .env("RUST_LOG", "warn,toolboxd::daemon=info")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(child.stderr.take().unwrap(), "\"message\":\"ready\"");
    (Proc(child), started.elapsed())
}

fn python_service(url: &str) -> Proc {
    let mut child = Command::new(venv_python())
        .arg(root().join("bench/python_service.py"))
        .args(["127.0.0.1", &port_of(url)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_line(child.stdout.take().unwrap(), "ready");
    Proc(child)
}

/// This benchmark binary, as a bare echo responder on `url`.
fn echo_responder(url: &str) -> Proc {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--echo-responder", url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    wait_line(child.stdout.take().unwrap(), "ready");
    Proc(child)
}

/// The baseline: answers `bench.echo` with its response derivation, as cheaply
/// as a Rust bus client can.
async fn run_echo_responder(url: &str) {
    let mut ws = client::connect(url).await.expect("connect");
    println!("ready");
    while let Some(Ok(frame)) = ws.next().await {
        tcp::quickack(ws.get_ref());
        let WsMessage::Text(text) = frame else {
            continue;
        };
        let Ok(m) = Message::decode(text.as_str()) else {
            continue;
        };
        if m.msg_type == "bench.echo" {
            let reply = m.response(m.data.clone());
            if ws.send(WsMessage::text(reply.encode())).await.is_err() {
                return;
            }
        }
    }
}

/// Utime + stime of a process.
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + fields
            .get(12)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_micros(ticks * 1_000_000 / hz)
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

/// Results of one closed-loop run.
#[derive(Clone, Copy)]
struct Load {
    rate: f64,
    p50: Duration,
    p99: Duration,
    calls: usize,
}

/// `conns` connections, each with one request in flight, for RUN after WARMUP.
async fn load(url: &str, topic: &str, data: Value, conns: usize) -> Load {
    let response = format!("{topic}.response");
    let start = Instant::now() + WARMUP;
    let end = start + RUN;
    let tasks: Vec<_> = (0..conns)
        .map(|c| {
            let (url, topic, response, data) = (
                url.to_owned(),
                topic.to_owned(),
                response.clone(),
                data.clone(),
            );
            tokio::spawn(async move {
                let mut ws = client::connect(&url).await.expect("connect");
                let mut latencies = Vec::new();
                let mut n = 0u64;
                while Instant::now() < end {
                    let mark = format!("{c}-{n}");
                    n += 1;
                    let frame =
                        json!({"type": topic, "data": data, "context": {"mark": mark}}).to_string();
                    let sent = Instant::now();
                    ws.send(WsMessage::text(frame)).await.expect("send");
                    loop {
                        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
                            .await
                            .unwrap_or_else(|_| panic!("no answer to {topic} within 10 s"))
                            .expect("open")
                            .expect("frame");
                        tcp::quickack(ws.get_ref());
                        let WsMessage::Text(text) = frame else {
                            continue;
                        };
                        // Cheap filter before parsing: most frames are others' traffic.
                        if !text.as_str().contains(&mark) {
                            continue;
                        }
                        let v: Value = serde_json::from_str(text.as_str()).unwrap();
                        if v["type"] == response.as_str() && v["context"]["mark"] == mark.as_str() {
                            assert!(v["data"].get("error").is_none(), "error answer: {v}");
                            break;
                        }
                    }
                    if sent >= start {
                        latencies.push(sent.elapsed());
                    }
                }
                close(ws).await;
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let pick = |q: f64| all[((all.len() - 1) as f64 * q) as usize];
    Load {
        rate: all.len() as f64 / RUN.as_secs_f64(),
        p50: pick(0.5),
        p99: pick(0.99),
        calls: all.len(),
    }
}

/// Closes a connection cleanly: the stock Python bus drops *other* clients
/// when one resets its connection abruptly.
async fn close(mut ws: client::WsStream) {
    let _ = ws.close(None).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

fn us(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn row(name: &str, l: &Load, ratio: &str, rss: Option<f64>, cpu_per_call: Option<Duration>) {
    println!(
        "| {name} | {:.0} | {} | {} | {ratio} | {} | {} |",
        l.rate,
        us(l.p50),
        us(l.p99),
        rss.map_or("-".into(), |r| format!("{r:.1} MiB")),
        cpu_per_call.map_or("-".into(), us)
    );
}

/// Load on a daemon, with its RSS and CPU per call.
async fn measured(
    url: &str,
    topic: &str,
    data: Value,
    conns: usize,
    pid: u32,
) -> (Load, f64, Duration) {
    let cpu0 = cpu_time(pid);
    let l = load(url, topic, data, conns).await;
    let cpu = cpu_time(pid).saturating_sub(cpu0);
    // CPU was also spent in the warm-up: spread over every call made.
    let total_calls = (l.calls as f64 * (RUN + WARMUP).as_secs_f64() / RUN.as_secs_f64()).max(1.0);
    (l, rss_mib(pid), cpu.div_f64(total_calls))
}

fn manifest(dir: &Path, id: &str, command: &Path, args: &[&str], extra: &str) {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        dir.join(format!("{id}.toml")),
        format!(
            "id = \"{id}\"\ncommand = {:?}\nargs = [{}]\n{extra}\n",
            command.display().to_string(),
            args.join(", ")
        ),
    )
    .unwrap();
}

async fn list_round_trip(url: &str) -> (Duration, usize) {
    let mut ws = client::connect(url).await.unwrap();
    let mut times = Vec::new();
    let mut tools = 0;
    for i in 0..21 {
        let mark = format!("list-{i}");
        let sent = Instant::now();
        ws.send(WsMessage::text(
            json!({"type": "ovos.tools.list", "data": {}, "context": {"mark": mark}}).to_string(),
        ))
        .await
        .unwrap();
        loop {
            let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
                continue;
            };
            tcp::quickack(ws.get_ref());
            // A full parse of the answer, without building a tree of it.
            #[derive(serde::Deserialize)]
            struct Answer {
                #[serde(rename = "type")]
                topic: String,
                data: Tools,
                context: Value,
            }
            #[derive(serde::Deserialize)]
            struct Tools {
                #[serde(default)]
                tools: Vec<serde::de::IgnoredAny>,
            }
            let Ok(a) = serde_json::from_str::<Answer>(text.as_str()) else {
                continue;
            };
            if a.topic == "ovos.tools.list.response" && a.context["mark"] == mark.as_str() {
                tools = a.data.tools.len();
                break;
            }
        }
        if i > 0 {
            times.push(sent.elapsed());
        }
    }
    close(ws).await;
    times.sort();
    (times[times.len() / 2], tools)
}

/// The slowest example child's own start: spawn, discover/initialize, tools/list.
fn child_startup(command: &str, args: &[&str], cwd: &Path) -> Duration {
    use std::io::Write;
    let started = Instant::now();
    let mut child = Command::new(command)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"bench","version":"0"}}}}}}"#).unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{{}}}}"#
    )
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    while let Some(Ok(line)) = lines.next() {
        if line.contains("\"id\":2") || line.contains("\"id\": 2") {
            break;
        }
    }
    let took = started.elapsed();
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    took
}

async fn bench() {
    let add = json!({"name": "add", "args": {"a": 2, "b": 3}});
    println!("| scenario | calls/s | p50 | p99 | ratio | daemon RSS | daemon CPU/call |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");

    // 1 and 4 (embedded half): toolboxd -> compiled child vs bare echo, embedded bus.
    let (_bus, url) = embedded_bus();
    let dir = tempdir("compiled");
    manifest(&dir, "echo", &echo_child(), &[], "");
    let (d, _) = daemon(&url, &dir);
    let echo = echo_responder(&url);
    let mut embedded_echo = Vec::new();
    for conns in [1, 8] {
        let e = load(&url, "bench.echo", add.clone(), conns).await;
        let (t, rss, cpu) = measured(&url, "ovos.tools.invoke", add.clone(), conns, d.pid()).await;
        row(
            &format!("1: bare echo, embedded bus, C={conns}"),
            &e,
            "1.00 (baseline)",
            None,
            None,
        );
        row(
            &format!("1: toolboxd -> compiled child, embedded bus, C={conns}"),
            &t,
            &format!(
                "{:.2} of echo throughput; p50 {:.2}x",
                t.rate / e.rate,
                t.p50.as_secs_f64() / e.p50.as_secs_f64()
            ),
            Some(rss),
            Some(cpu),
        );
        embedded_echo.push(e);
    }
    drop(echo);
    drop(d);

    // 2: Python child vs the Python service, embedded bus, C=8.
    let dir = tempdir("python");
    manifest(
        &dir,
        "math",
        Path::new("python3"),
        &[&root()
            .join("examples/python/math_toolbox.py")
            .display()
            .to_string()],
        "",
    );
    let (d, _) = daemon(&url, &dir);
    let (t, rss, cpu) = measured(&url, "ovos.tools.invoke", add.clone(), 8, d.pid()).await;
    drop(d);
    let svc = python_service(&url);
    let (p, py_rss, py_cpu) = measured(&url, "ovos.tools.invoke", add.clone(), 8, svc.pid()).await;
    drop(svc);
    row(
        "2: Python service (ovos-PHAL-plugin-tools), embedded bus, C=8",
        &p,
        "1.00 (baseline)",
        Some(py_rss),
        Some(py_cpu),
    );
    row(
        "2: toolboxd -> Python child, embedded bus, C=8",
        &t,
        &format!("{:.2}x the Python service's throughput", t.rate / p.rate),
        Some(rss),
        Some(cpu),
    );
    drop(_bus);

    // 3 and 4 (Python half): on the stock Python bus, a caller that quick-ACKs.
    let (_pybus, pyurl, _home) = python_bus();
    let echo = echo_responder(&pyurl);
    let mut python_echo = Vec::new();
    for conns in [1, 8] {
        python_echo.push(load(&pyurl, "bench.echo", add.clone(), conns).await);
    }
    drop(echo);
    let svc = python_service(&pyurl);
    let p = load(&pyurl, "ovos.tools.invoke", add.clone(), 1).await;
    drop(svc);
    let dir = tempdir("pybus");
    manifest(&dir, "echo", &echo_child(), &[], "");
    let (d, _) = daemon(&pyurl, &dir);
    let (t, rss, cpu) = measured(&pyurl, "ovos.tools.invoke", add.clone(), 1, d.pid()).await;
    drop(d);
    row(
        "3: Python service on the Python bus, C=1",
        &p,
        "1.00 (baseline)",
        None,
        None,
    );
    row(
        "3: toolboxd -> compiled child on the Python bus, C=1",
        &t,
        &format!(
            "p50 {:.1}x lower",
            p.p50.as_secs_f64() / t.p50.as_secs_f64()
        ),
        Some(rss),
        Some(cpu),
    );
    for (i, conns) in [1, 8].iter().enumerate() {
        row(
            &format!("4: bare echo, Python bus, C={conns}"),
            &python_echo[i],
            "1.00 (baseline)",
            None,
            None,
        );
        row(
            &format!("4: bare echo, embedded bus, C={conns}"),
            &embedded_echo[i],
            &format!(
                "{:.2}x the Python bus",
                embedded_echo[i].rate / python_echo[i].rate
            ),
            None,
            None,
        );
    }
    drop(_pybus);

    println!();
    let (_bus, url) = embedded_bus();
    // 5: RSS with 20 toolboxes.
    let dir = tempdir("twenty");
    for i in 0..20 {
        manifest(&dir, &format!("t{i}"), &echo_child(), &[], "");
    }
    let (d, _) = daemon(&url, &dir);
    let _ = list_round_trip(&url).await;
    println!("5: daemon RSS with 20 toolboxes: {:.1} MiB (Python service: {py_rss:.1} MiB in this run) -> {:.2} of it", rss_mib(d.pid()), rss_mib(d.pid()) / py_rss);
    drop(d);

    // 6: start -> first ovos.tools.list with every example tool, vs the slowest child's own start.
    let examples = root().join("manifests");
    let math = child_startup(
        "python3",
        &["../examples/python/math_toolbox.py"],
        &examples,
    );
    let text = child_startup("../examples/shell/text_toolbox.sh", &[], &examples);
    let slowest = math.max(text);
    let dir = tempdir("startup");
    for f in ["math.toml", "text.toml"] {
        let text = std::fs::read_to_string(examples.join(f)).unwrap().replace(
            "../examples",
            &root().join("examples").display().to_string(),
        );
        std::fs::write(dir.join(f), text).unwrap();
    }
    let started = Instant::now();
    let (d, _) = daemon(&url, &dir);
    let (_, tools) = list_round_trip(&url).await;
    let to_list = started.elapsed();
    drop(d);
    println!(
        "6: start -> first ovos.tools.list ({tools} tools): {:.0} ms; slowest child alone (math {:.0} ms, text {:.0} ms): {:.0} ms -> {:.2}x",
        to_list.as_secs_f64() * 1e3,
        math.as_secs_f64() * 1e3,
        text.as_secs_f64() * 1e3,
        slowest.as_secs_f64() * 1e3,
        to_list.as_secs_f64() / slowest.as_secs_f64()
    );

    // 7: 200 toolboxes x 10 tools vs 2 x 10: list round trip and RSS.
    let mut results = Vec::new();
    for count in [2usize, 200] {
        let dir = tempdir(&format!("many{count}"));
        for i in 0..count {
            manifest(
                &dir,
                &format!("m{i}"),
                &echo_child(),
                &[],
                "env = { EXTRA_TOOLS = \"6\" }",
            );
        }
        let (d, _) = daemon(&url, &dir);
        let (rt, tools) = list_round_trip(&url).await;
        results.push((count, rt, tools, rss_mib(d.pid())));
        drop(d);
    }
    let (small, large) = (results[0], results[1]);
    println!(
        "7: ovos.tools.list round trip: {} toolboxes/{} tools {} vs {} toolboxes/{} tools {} -> {:.1}x; RSS {:.1} -> {:.1} MiB",
        small.0, small.2, us(small.1), large.0, large.2, us(large.1),
        large.1.as_secs_f64() / small.1.as_secs_f64(), small.3, large.3
    );

    // 8: a CPU-bound Python tool, instances = 2 vs 1.
    let burn = json!({"name": "burn", "args": {"ms": 5}});
    let mut rates = Vec::new();
    for instances in [1, 2] {
        let dir = tempdir(&format!("cpu{instances}"));
        manifest(
            &dir,
            "cpu",
            Path::new("python3"),
            &[&root().join("bench/cpu_toolbox.py").display().to_string()],
            &format!("instances = {instances}"),
        );
        let (d, _) = daemon(&url, &dir);
        rates.push(load(&url, "ovos.tools.invoke", burn.clone(), 8).await.rate);
        drop(d);
    }
    println!(
        "8: CPU-bound Python tool (5 ms), C=8: instances=1 {:.0} calls/s, instances=2 {:.0} calls/s -> {:.2}x",
        rates[0],
        rates[1],
        rates[1] / rates[0]
    );

    // 9: 100 concurrent 0.2 s calls to one toolbox.
    let dir = tempdir("concurrent");
    manifest(
        &dir,
        "echo",
        &echo_child(),
        &[],
        "[limits]\nmax_concurrent_calls = 128\n",
    );
    let (d, _) = daemon(&url, &dir);
    let mut ws = client::connect(&url).await.unwrap();
    let started = Instant::now();
    for i in 0..100 {
        let frame = json!({"type": "ovos.tools.invoke", "data": {"name": "sleep", "args": {"ms": 200}}, "context": {"mark": format!("s{i}")}});
        ws.send(WsMessage::text(frame.to_string())).await.unwrap();
    }
    let mut answered = 0;
    while answered < 100 {
        let WsMessage::Text(text) = ws.next().await.unwrap().unwrap() else {
            continue;
        };
        tcp::quickack(ws.get_ref());
        if text.as_str().contains("ovos.tools.invoke.response") {
            answered += 1;
        }
    }
    let took = started.elapsed();
    close(ws).await;
    drop(d);
    println!(
        "9: 100 concurrent 0.2 s calls answered in {:.0} ms -> {:.2}x one call",
        took.as_secs_f64() * 1e3,
        took.as_secs_f64() / 0.2
    );
    for dir in [
        "compiled",
        "python",
        "pybus",
        "twenty",
        "startup",
        "many2",
        "many200",
        "concurrent",
        "xdg",
    ] {
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("toolboxd-bench-{dir}-{}", std::process::id())),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some(i) = args.iter().position(|a| a == "--echo-responder") {
        runtime.block_on(run_echo_responder(&args[i + 1]));
        return;
    }
    if args.iter().any(|a| a == "--list" || a == "--test") {
        return; // `cargo test --benches` / `cargo bench -- --list`: nothing to list
    }
    runtime.block_on(bench());
}
