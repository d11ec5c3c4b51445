//! OTLP header values are credentials (`authorization=Bearer <token>`):
//! no output may show them, whatever the user gets wrong, and no redirect
//! may carry them elsewhere.
mod common;

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpListener,
    process::Command,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::daemon::{OBSERVER, start_daemon_with_env};

const TOKEN: &str = "s3cr3t-T0KEN-4711";

/// `observer ARGS` with `env`: (exit code, stdout and stderr together).
fn observer(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(OBSERVER).args(args).envs(env.iter().copied()).env_remove("RUST_LOG").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("observer-secrets-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_token_in_the_headers_appears_in_no_output() {
    let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318");
    let good = format!("authorization=Bearer%20{TOKEN}");
    let malformed = format!("authorization=Bearer%20{TOKEN},broken");
    let no_equals = format!("Bearer {TOKEN}");
    let bad_file = file("bad", &format!("otlp-endpoint = \"http://c:4318\"\notlp-headers = \"{malformed}\"\n"));
    let unterminated = file("unterminated", &format!("otlp-headers = \"{good}\n"));
    let bad_file = bad_file.to_str().unwrap();
    let unterminated = unterminated.to_str().unwrap();
    // (what, arguments, environment, the exit code it must end with)
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, i32);
    const USAGE: i32 = observer::cli::USAGE_EXIT;
    let cases: Vec<Case> = vec![
        (
            "malformed variable",
            vec!["run", "--dry-run"],
            vec![endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", &malformed)],
            USAGE,
        ),
        ("malformed flag", vec!["run", "--dry-run", "--otlp-headers", &no_equals], vec![endpoint], USAGE),
        ("--help with the variable set", vec!["run", "--help"], vec![("OTEL_EXPORTER_OTLP_HEADERS", &good)], 0),
        ("--dry-run", vec!["run", "--dry-run"], vec![endpoint, ("OTEL_EXPORTER_OTLP_HEADERS", &good)], 0),
        ("malformed in the file", vec!["run", "--dry-run", "--config", bad_file], vec![], 1),
        ("unterminated in the file", vec!["run", "--dry-run", "--config", unterminated], vec![], 1),
    ];
    for (what, args, env, code) in cases {
        let (got, text) = observer(&args, &env);
        assert_eq!(got, code, "{what}: {text}");
        assert!(!text.contains(TOKEN), "{what}: the token is in the output:\n{text}");
        if code != 0 {
            assert!(text.contains("headers"), "{what}: the error names the headers:\n{text}");
        }
    }
    let _ = std::fs::remove_file(bad_file);
    let _ = std::fs::remove_file(unterminated);
}

/// A minimal HTTP server on loopback: answers every request with `answer`
/// and keeps each request's head; its port.
fn http_server(answer: String, seen: Arc<Mutex<Vec<String>>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; length];
            let _ = std::io::Read::read_exact(&mut reader, &mut body);
            seen.lock().unwrap().push(head);
            let _ = (&stream).write_all(answer.as_bytes());
        }
    });
    port
}

#[test]
fn an_otlp_collector_that_redirects_gets_the_headers_but_its_target_does_not() {
    let elsewhere_seen = Arc::new(Mutex::new(Vec::new()));
    let elsewhere = http_server("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".into(), elsewhere_seen.clone());
    let collector_seen = Arc::new(Mutex::new(Vec::new()));
    let redirect = format!(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{elsewhere}/v1/metrics\r\ncontent-length: 0\r\n\r\n"
    );
    let collector = http_server(redirect, collector_seen.clone());

    let header = format!("x-api-key={TOKEN}");
    let endpoint = format!("http://127.0.0.1:{collector}");
    let mut daemon = start_daemon_with_env(
        &["--otlp-endpoint", &endpoint, "--otlp-protocol", "http/protobuf", "--otlp-interval", "300ms"],
        &[("OTEL_EXPORTER_OTLP_HEADERS", &header)],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while collector_seen.lock().unwrap().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    daemon.terminate(Duration::from_secs(10));
    let pushes = collector_seen.lock().unwrap().clone();
    assert!(pushes.len() >= 3, "the collector got {} pushes", pushes.len());
    assert!(pushes.iter().all(|h| h.contains(TOKEN)), "the collector gets the header: {pushes:?}");
    let followed = elsewhere_seen.lock().unwrap().clone();
    assert!(followed.is_empty(), "a redirect was followed, with the headers: {followed:?}");
    assert!(!daemon.log().contains(TOKEN), "the token is in the log:\n{}", daemon.log());
}
