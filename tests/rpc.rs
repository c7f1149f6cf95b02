//! Scale-out over ggml's RPC backend: `sd-cli --rpc-server` processes on loopback serve their
//! CPU as devices `RPC0`, `RPC1`, ... to a run given `--rpc-servers`.
//!
//! The servers compute with ggml's own CPU kernels and the client treats them as devices
//! (attention K/V in f16, as on a GPU), while a CPU run uses the blocked kernels and f32
//! attention, so split runs are compared to the CPU image at PSNR ≥ 60 dB (8-bit), and to
//! diffusers' image at the pipeline tests' 40 dB. Segmented execution on an RPC device
//! (`--max-vram RPC0=...`, with and without `--offload-to-cpu`) must equal the monolithic run
//! on that device byte for byte.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use sd_cli::image_io::read_png;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sd-cli"))
}

/// A loopback port nothing listens on right now, never handed out twice in this process.
///
/// Ports come from below the kernel's ephemeral range (32768 and up by default): the tests
/// run in parallel and bind port 0 for their fake servers and connect out, and an ephemeral
/// port released here could be taken by one of those before a server process binds it (the
/// run would then talk to a fake server).
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % SPAN;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < SPAN, "no free loopback port below 32000");
        let port = (LOW + (start + n * 7) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// An `sd-cli --rpc-server` child process, killed when dropped.
struct Server {
    child: Child,
    endpoint: String,
}

impl Server {
    fn start() -> Server {
        let port = free_port();
        let child = bin()
            .args(["--rpc-server", "--port", &port.to_string(), "-t", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let endpoint = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut server = Server { child, endpoint };
        while TcpStream::connect(&server.endpoint).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("RPC server on {} exited: {status}", server.endpoint);
            }
            assert!(
                Instant::now() < deadline,
                "RPC server on {} did not start",
                server.endpoint
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn pixart_args(out: &Path) -> Vec<String> {
    let d = fixture_path("pixart_pipeline");
    let tok = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/tokenizers/t5-v1_1.tokenizer.json");
    let mut a: Vec<String> = vec![
        "--diffusion-model".into(),
        d.join("transformer").display().to_string(),
        "--t5xxl".into(),
        d.join("text_encoder").display().to_string(),
        "--vae".into(),
        d.join("vae").display().to_string(),
        "--t5xxl-tokenizer".into(),
        tok.display().to_string(),
    ];
    a.extend(
        [
            "-p",
            "A Lovely cat, holding a sign!  ",
            "-n",
            "blurry",
            "--steps",
            "4",
            "--cfg-scale",
            "4.5",
            "-W",
            "24",
            "-H",
            "16",
            "-s",
            "42",
            "--rng",
            "cpu",
            "--sampling-method",
            "euler",
            "--scheduler",
            "discrete",
            "-t",
            "2",
            "-o",
        ]
        .map(String::from),
    );
    a.push(out.display().to_string());
    a
}

fn qwen_args(out: &Path, steps: u32) -> Vec<String> {
    let d = fixture_path("qwen_image_pipeline");
    let mut a: Vec<String> = Vec::new();
    for (flag, file) in [
        ("--diffusion-model", "diffusion_model.safetensors"),
        ("--vae", "vae.safetensors"),
        ("--llm", "llm.safetensors"),
    ] {
        a.push(flag.into());
        a.push(d.join(file).display().to_string());
    }
    a.extend(
        [
            "-p",
            "a lovely cat holding a sign says 'qwen2.1.cpp'",
            "-n",
            "blurry, low quality",
            "--cfg-scale",
            "4",
            "-W",
            "96",
            "-H",
            "64",
            "-s",
            "42",
            "--rng",
            "cpu",
            "-t",
            "2",
        ]
        .map(String::from),
    );
    a.extend(["--steps".to_string(), steps.to_string()]);
    a.extend(["-o".to_string(), out.display().to_string()]);
    a
}

fn run(args: &[String], extra: &[&str]) -> Output {
    bin().args(args).args(extra).output().unwrap()
}

fn run_ok(args: &[String], extra: &[&str], out: &Path) -> Vec<u8> {
    let o = run(args, extra);
    assert!(
        o.status.success(),
        "sd-cli {extra:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    read_png(out).unwrap().data
}

#[test]
fn pixart_split_over_two_rpc_servers_gives_the_cpu_image() {
    let (a, b) = (Server::start(), Server::start());
    let dir = tempfile::tempdir().unwrap();
    let (cpu_png, rpc_png) = (dir.path().join("cpu.png"), dir.path().join("rpc.png"));
    let cpu = run_ok(&pixart_args(&cpu_png), &[], &cpu_png);
    let servers = format!("{},{}", a.endpoint, b.endpoint);
    let rpc = run_ok(
        &pixart_args(&rpc_png),
        &[
            "--rpc-servers",
            &servers,
            "--backend",
            "diffusion=RPC0,te=RPC1,vae=cpu",
        ],
        &rpc_png,
    );
    let p = psnr(&cpu, &rpc);
    eprintln!("PixArt, DiT on RPC0 and T5 on RPC1 vs CPU: PSNR {p:.1} dB");
    assert!(p >= 60.0, "PSNR {p:.1} dB");
    let reference = open_fixture("pixart_pipeline/reference.safetensors");
    let want = image_bytes(&tensor(&reference, "image"));
    let p = psnr(&rpc, &want);
    eprintln!("PixArt over RPC vs diffusers: PSNR {p:.1} dB");
    assert!(p >= 40.0, "PSNR {p:.1} dB");
}

#[test]
fn qwen_image_2_1_split_over_rpc_servers_and_the_cpu() {
    let (a, b) = (Server::start(), Server::start());
    let dir = tempfile::tempdir().unwrap();
    let png = |name: &str| dir.path().join(name);
    let cpu = run_ok(&qwen_args(&png("cpu.png"), 4), &[], &png("cpu.png"));
    let servers = format!("{},{}", a.endpoint, b.endpoint);
    let split = [
        "--rpc-servers",
        &servers,
        "--backend",
        "diffusion=RPC1,te=RPC0,vae=cpu",
    ];
    let rpc = run_ok(&qwen_args(&png("rpc.png"), 4), &split, &png("rpc.png"));
    let p = psnr(&cpu, &rpc);
    eprintln!("Qwen Image 2.1, DiT on RPC1 and LLM on RPC0 vs CPU: PSNR {p:.1} dB");
    assert!(p >= 60.0, "PSNR {p:.1} dB");

    // A budget on RPC1 that cuts the DiT (and the text encoder on RPC0 stays whole): the
    // segments, with weights streamed from host memory and prefetched on a second queue or
    // not, give the monolithic image exactly.
    for extra in [
        &["--max-vram", "RPC1=0.0005"][..],
        &["--max-vram", "RPC1=0.0005", "--offload-to-cpu"],
        &[
            "--max-vram",
            "RPC1=0.0005",
            "--offload-to-cpu",
            "--disable-prefetch",
        ],
    ] {
        let out = png("seg.png");
        let mut args = split.to_vec();
        args.extend_from_slice(extra);
        args.push("-v");
        let o = run(&qwen_args(&out, 4), &args);
        let log = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{extra:?}: {log}");
        assert!(
            log.contains("qwen_image_2_1: ran in") && !log.contains("ran in 1 segments"),
            "{extra:?} did not run the DiT in segments: {log}"
        );
        assert_eq!(read_png(&out).unwrap().data, rpc, "{extra:?} differs");
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn a_server_stopped_mid_run_is_a_clear_error_and_leaves_no_output() {
    let mut server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("never.png");
    // Without a terminal the progress bar prints a line per 10% of the steps: the server is
    // stopped after the first tenth, with nine tenths of the run still to go.
    let mut child = bin()
        .args(qwen_args(&out, 20_000))
        .args(["--rpc-servers", &server.endpoint, "--backend", "RPC0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&all).contains("sampling") {
                let _ = tx.send(());
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    if let Err(e) = rx.recv_timeout(Duration::from_secs(120)) {
        let _ = child.kill();
        let log = reader.join().unwrap();
        panic!("the run never reached sampling ({e:?}): {log}");
    }
    server.kill();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the run did not stop after its RPC server went away");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = reader.join().unwrap();
    assert_eq!(status.code(), Some(1), "exit status {status:?}: {log}");
    assert!(
        log.contains(&server.endpoint) && log.contains("RPC server"),
        "the error does not name the server: {log}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

/// A listener that answers every connection with `reply` (after reading the greeting).
fn fake_server(reply: Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut greeting = [0u8; 1 + 8 + 24];
            let _ = s.read_exact(&mut greeting);
            let _ = s.write_all(&reply);
        }
    });
    endpoint
}

#[test]
fn unreachable_or_foreign_servers_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.png");
    let args = pixart_args(&out);
    let closed = format!("127.0.0.1:{}", free_port());
    let mut old_version = 28u64.to_le_bytes().to_vec();
    old_version.extend([6, 0, 0, 0]);
    old_version.extend([0u8; 24]);
    let cases: Vec<(String, &str)> = vec![
        (closed, "cannot connect"),
        ("localhost".into(), "expected host:port"),
        ("127.0.0.1:http".into(), "not a port number"),
        (fake_server(Vec::new()), "greeting failed"),
        (
            fake_server(3u64.to_le_bytes().to_vec()),
            "not a ggml RPC server",
        ),
        (fake_server(old_version), "protocol 6.0.0"),
    ];
    for (endpoint, want) in cases {
        let o = run(&args, &["--rpc-servers", &endpoint, "--backend", "RPC0"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{endpoint}: {err}");
        assert!(
            err.contains("--rpc-servers") && err.contains(&endpoint) && err.contains(want),
            "{endpoint}: expected '{want}' in: {err}"
        );
        assert!(!out.exists());
    }
}

#[test]
fn list_devices_shows_each_rpc_device_with_its_memory() {
    let (a, b) = (Server::start(), Server::start());
    let servers = format!("{},{}", a.endpoint, b.endpoint);
    let o = bin()
        .args(["--rpc-servers", &servers, "--list-devices"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for (name, endpoint) in [("RPC0", &a.endpoint), ("RPC1", &b.endpoint)] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in: {text}"));
        assert!(
            line.contains(endpoint.as_str()) && line.contains("GiB free of"),
            "{line}"
        );
    }
}

#[test]
fn the_rpc_server_refuses_what_it_cannot_serve() {
    // A port already taken.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = bin()
        .args(["--rpc-server", "--port", &port])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot listen") && err.contains(&port),
        "{err}"
    );
    // Components are placed by the client, not the server.
    let o = bin()
        .args(["--rpc-server", "--port", &free_port().to_string()])
        .args(["--backend", "diffusion=cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--backend"), "{err}");
    // A device this machine does not have.
    let o = bin()
        .args(["--rpc-server", "--port", &free_port().to_string()])
        .args(["--backend", "CUDA7"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("CUDA7"), "{err}");
    // The server's own flags need --rpc-server.
    let o = bin().args(["--port", "50052"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}
