//! observer-churn: a small TCP traffic generator that reproduces the
//! incidents observer exists for, and reports what it saw (the ground truth
//! the kernel gave it: connect() results by errno). Used by the kernel tests
//! and the benchmark; run it inside a network namespace.
//!
//! Output: one line `connected=N accepted=N errors=NAME:COUNT,...`.
use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    time::Duration,
};

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "observer-churn", about = "TCP churn generator for observer's tests and benchmarks")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Close {
    /// The client closes first: the client's socket goes to TIME_WAIT.
    Client,
    /// The server closes first: the server's socket goes to TIME_WAIT.
    Server,
}

#[derive(Subcommand)]
enum Cmd {
    /// Listen; print "ready" once listening, then serve until killed.
    Serve {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long, default_value_t = 128)]
        backlog: i32,
        /// Never call accept(): the queue fills and the kernel drops.
        #[arg(long)]
        never_accept: bool,
        /// Who closes first on each accepted connection.
        #[arg(long, value_enum, default_value_t = Close::Client)]
        close_first: Close,
        /// Keep accepted connections open (for port exhaustion).
        #[arg(long)]
        hold: bool,
        /// With --hold: each line `N` on standard input closes the N
        /// connections held longest (a server that ends its side of
        /// chosen connections when a test says so).
        #[arg(long, requires = "hold")]
        close_on_input: bool,
        /// With --hold: hold at most this many; close every further one
        /// at once, as a database past its connection limit does.
        #[arg(long, requires = "hold")]
        max_open: Option<usize>,
    },
    /// Open connections, one after another.
    Connect {
        #[arg(long)]
        to: SocketAddr,
        /// Connections to attempt (failures included).
        #[arg(long, default_value_t = 1)]
        count: u64,
        /// Keep every connection open until the end (exhausts ports).
        #[arg(long)]
        hold: bool,
        /// With --hold: after connecting, print the report, then keep the
        /// connections until standard input closes (a pool held open
        /// while a test reads the kernel's view).
        #[arg(long, requires = "hold")]
        until_eof: bool,
        /// With --hold: shut each connection down for writing as soon as
        /// it is made (shutdown(SHUT_WR): the first FIN, the socket in
        /// FIN_WAIT2) and hold it half-closed (closing sockets held open).
        #[arg(long, requires = "hold")]
        half_close: bool,
        /// Keep each connection open this long before closing it, the
        /// durations taken in turn (e.g. 100ms,100ms,500ms,2s).
        #[arg(long, value_parser = humantime::parse_duration, value_delimiter = ',', conflicts_with = "hold")]
        life: Vec<Duration>,
        /// Who closes first (must match the server's --close-first).
        #[arg(long, value_enum, default_value_t = Close::Client)]
        close_first: Close,
        /// Non-blocking connects, each given this long, then closed (for
        /// listeners that never accept: the SYN may never be answered).
        #[arg(long, value_parser = humantime::parse_duration)]
        nonblocking: Option<Duration>,
        /// With --nonblocking: learn the outcome by calling connect() again
        /// (as some libraries do), not by reading SO_ERROR.
        #[arg(long, requires = "nonblocking")]
        ask_again: bool,
        /// Open each connection with TCP Fast Open: sendto(MSG_FASTOPEN)
        /// of one byte, no connect() call (the kernel opens it inside
        /// sendmsg(); net.ipv4.tcp_fastopen's client bit, on by default).
        #[arg(long, conflicts_with = "nonblocking")]
        fast_open: bool,
        /// Spread the attempts evenly over this long instead of making them
        /// back to back (so a scraper sees the counts grow).
        #[arg(long, value_parser = humantime::parse_duration)]
        spread: Option<Duration>,
        /// Before each attempt, rename this process (`prctl(PR_SET_NAME)`,
        /// what `ps` and observer see): churn-0, churn-1, ...
        #[arg(long)]
        rename: bool,
        /// Connect from a second thread while the main (leader) thread
        /// ends (like pthread_exit): the process runs on without its leader.
        #[arg(long)]
        leader_exits: bool,
    },
    /// One connect() to each port of `ports` on `to` (a scanner, or a
    /// client meeting ever-new destinations), one after another; prints
    /// what the kernel answered, like `connect`.
    Scan {
        #[arg(long)]
        to: std::net::IpAddr,
        /// First and last port, e.g. 20000-20099.
        #[arg(long, value_parser = port_range)]
        ports: (u16, u16),
        /// After the report, live on until standard input closes (a
        /// scanner that sleeps, its series kept).
        #[arg(long)]
        hold: bool,
    },
    /// Benchmark load: a listener and `threads` client threads in this one
    /// process, `connections` cycles of connect, accept, client-first close,
    /// as fast as possible. Prints `cycles=N seconds=S rate=R`.
    Churn {
        #[arg(long, default_value = "127.0.0.1:9000")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 2)]
        threads: usize,
        #[arg(long, default_value_t = 20_000)]
        connections: u64,
        /// Take at least this long: each thread waits whenever it is ahead
        /// of an even pace (so a scraper sees the storm grow over several
        /// scrapes instead of one burst).
        #[arg(long, value_parser = humantime::parse_duration)]
        spread: Option<Duration>,
    },
    /// Benchmark storm: `attempts` connects as fast as possible that fail:
    /// `eaddrnotavail` after holding every port of the (narrow) range, or
    /// `overflow` against a listener that never accepts. Prints what the
    /// kernel answered, like `connect`.
    Storm {
        #[arg(long)]
        to: SocketAddr,
        #[arg(long, value_enum)]
        kind: StormKind,
        #[arg(long, default_value_t = 20_000)]
        attempts: u64,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StormKind {
    /// Hold connections until the port range is exhausted, then keep trying.
    Eaddrnotavail,
    /// Non-blocking connects closed at once: each SYN meets a full queue.
    Overflow,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve { listen, backlog, never_accept, close_first, hold, close_on_input, max_open } => {
            serve(listen, backlog, never_accept, close_first, hold, close_on_input, max_open)
        }
        Cmd::Connect {
            to,
            count,
            hold,
            until_eof,
            half_close,
            life,
            close_first,
            nonblocking,
            ask_again,
            fast_open,
            spread,
            rename,
            leader_exits,
        } => {
            let pause = spread.map(|d| d / count.max(1) as u32);
            let opening = match (nonblocking, fast_open) {
                (Some(wait), _) => Some(Opening::Nonblocking(Nonblocking { wait, ask_again })),
                (None, true) => Some(Opening::FastOpen),
                (None, false) => None,
            };
            let hold = match (hold, until_eof) {
                (false, _) => Hold::No,
                (true, false) => Hold::UntilDone,
                (true, true) => Hold::UntilEof,
            };
            let run = move || connect(to, count, hold, half_close, &life, close_first, opening, pause, rename);
            if leader_exits {
                std::thread::spawn(run);
                // The exit system call ends only the calling (leader) thread,
                // as pthread_exit would, without the unwinding that Rust's
                // main refuses; the process ends when the other thread does.
                // SAFETY: this thread holds no lock and touches nothing after.
                unsafe { nix::libc::syscall(nix::libc::SYS_exit, 0) };
                unreachable!("the exit system call returned");
            }
            run()
        }
        Cmd::Scan { to, ports, hold } => scan(to, ports, hold),
        Cmd::Churn { listen: addr, threads, connections, spread } => churn(addr, threads, connections, spread),
        Cmd::Storm { to, kind, attempts } => storm(to, kind, attempts),
    }
}

fn port_range(s: &str) -> Result<(u16, u16), String> {
    let (first, last) = s.split_once('-').ok_or("write FIRST-LAST, e.g. 20000-20099")?;
    let port = |p: &str| p.parse::<u16>().map_err(|e| format!("`{p}`: {e}"));
    Ok((port(first)?, port(last)?))
}

fn scan(to: std::net::IpAddr, (first, last): (u16, u16), hold: bool) {
    let mut connected = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for port in first..=last {
        match TcpStream::connect((to, port)) {
            Ok(_) => connected += 1,
            Err(e) => {
                let name = e.raw_os_error().map(errno_name).unwrap_or_else(|| format!("{:?}", e.kind()));
                *errors.entry(name).or_default() += 1;
            }
        }
    }
    let errors: Vec<String> = errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!("connected={connected} errors={}", errors.join(","));
    if hold {
        std::io::Write::flush(&mut std::io::stdout()).unwrap();
        std::io::copy(&mut std::io::stdin(), &mut std::io::sink()).unwrap();
    }
}

fn churn(addr: SocketAddr, threads: usize, connections: u64, spread: Option<Duration>) {
    use std::sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    };
    let listener = Arc::new(listen(addr, 4096));
    let served = Arc::new(AtomicU64::new(0));
    for _ in 0..threads {
        let (listener, served) = (listener.clone(), served.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                // Wait for the client's FIN: the client closes first.
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                drop(stream);
                served.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    let started = std::time::Instant::now();
    let per_thread = connections / threads as u64;
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let mut failed = 0u64;
                for i in 0..per_thread {
                    if let Some(spread) = spread {
                        let due = spread.mul_f64(i as f64 / per_thread as f64);
                        if let Some(ahead) = due.checked_sub(started.elapsed()) {
                            std::thread::sleep(ahead);
                        }
                    }
                    match TcpStream::connect(addr) {
                        Ok(stream) => drop(stream),
                        Err(_) => failed += 1,
                    }
                }
                failed
            })
        })
        .collect();
    let failed: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let seconds = started.elapsed().as_secs_f64();
    let cycles = per_thread * threads as u64;
    // Exit only once every accepted connection was closed by the server:
    // exiting earlier would reset the ones still queued, and they would
    // never reach TIME_WAIT (the kernel's truth would then differ from ours).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while served.load(Ordering::Relaxed) < cycles - failed && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("cycles={cycles} failed={failed} seconds={seconds:.3} rate={:.0}", cycles as f64 / seconds);
}

fn storm(to: SocketAddr, kind: StormKind, attempts: u64) {
    let mut held = Vec::new();
    let mut connected = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut record = |result: std::io::Result<TcpStream>, held: &mut Vec<TcpStream>| match result {
        Ok(s) => {
            held.push(s);
            true
        }
        Err(e) => {
            let name = e.raw_os_error().map(errno_name).unwrap_or_else(|| format!("{:?}", e.kind()));
            *errors.entry(name).or_default() += 1;
            false
        }
    };
    if kind == StormKind::Eaddrnotavail {
        // Hold connections until the range is exhausted; the failure that
        // ends this phase is a failure like the ones after it.
        while record(TcpStream::connect(to), &mut held) {}
    }
    let holding = held.len();
    let started = std::time::Instant::now();
    for _ in 0..attempts {
        let result = match kind {
            StormKind::Eaddrnotavail => TcpStream::connect(to),
            StormKind::Overflow => connect_nonblocking(to, Nonblocking { wait: Duration::ZERO, ask_again: false }),
        };
        if record(result, &mut held) {
            connected += 1;
            held.pop(); // storm connections are closed at once
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let errors: Vec<String> = errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!("connected={connected} held={holding} errors={} seconds={seconds:.3}", errors.join(","));
}

fn serve(
    addr: SocketAddr,
    backlog: i32,
    never_accept: bool,
    close_first: Close,
    hold: bool,
    close_on_input: bool,
    max_open: Option<usize>,
) {
    let listener = listen(addr, backlog);
    println!("ready");
    std::io::stdout().flush().unwrap();
    if never_accept {
        loop {
            std::thread::park();
        }
    }
    // Oldest first: accept() takes connections in the order their
    // handshakes completed.
    let held = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    if close_on_input {
        let held = held.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines().map_while(Result::ok) {
                let n: usize = line.trim().parse().unwrap_or_else(|_| panic!("not a count: {line}"));
                let mut held = held.lock().unwrap();
                let closing: Vec<TcpStream> = (0..n).map_while(|_| held.pop_front()).collect();
                drop(closing);
            }
        });
    }
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        if hold {
            let mut held = held.lock().unwrap();
            if max_open.is_none_or(|max| held.len() < max) {
                held.push_back(stream);
            }
            // Else dropped: closed at once, the server's FIN first.
            continue;
        }
        match close_first {
            Close::Server => drop(stream),
            Close::Client => {
                // Wait for the client's FIN, then close our side.
                let mut buf = [0u8; 64];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
            }
        }
    }
}

/// std's TcpListener::bind uses a fixed backlog; tests need a tiny one.
fn listen(addr: SocketAddr, backlog: i32) -> TcpListener {
    let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    // SAFETY: listen(2) on a valid, bound socket fd.
    let rc = unsafe { libc_listen(listener.as_raw_fd(), backlog) };
    assert_eq!(rc, 0, "listen: {}", std::io::Error::last_os_error());
    listener
}

unsafe extern "C" {
    #[link_name = "listen"]
    fn libc_listen(fd: i32, backlog: i32) -> i32;
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    No,
    /// Until every attempt is made.
    UntilDone,
    /// Until standard input closes, after the report is printed.
    UntilEof,
}

#[allow(clippy::too_many_arguments, reason = "one per flag of `connect`")]
fn connect(
    to: SocketAddr,
    count: u64,
    hold: Hold,
    half_close: bool,
    life: &[Duration],
    close_first: Close,
    opening: Option<Opening>,
    pause: Option<Duration>,
    rename: bool,
) {
    let mut connected = 0u64;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut held = Vec::new();
    for attempt in 0..count {
        if let Some(pause) = pause {
            std::thread::sleep(pause);
        }
        if rename {
            let name = std::ffi::CString::new(format!("churn-{attempt}")).expect("no NUL");
            nix::sys::prctl::set_name(&name).expect("prctl(PR_SET_NAME)");
        }
        let result = match opening {
            Some(Opening::Nonblocking(how)) => connect_nonblocking(to, how),
            Some(Opening::FastOpen) => connect_fast_open(to),
            None => TcpStream::connect(to),
        };
        match result {
            Ok(mut stream) => {
                connected += 1;
                if !life.is_empty() {
                    std::thread::sleep(life[(attempt % life.len() as u64) as usize]);
                }
                if hold != Hold::No {
                    if half_close {
                        let _ = stream.shutdown(Shutdown::Write);
                    }
                    held.push(stream);
                } else if !matches!(opening, Some(Opening::Nonblocking(_))) {
                    match close_first {
                        Close::Client => drop(stream),
                        Close::Server => {
                            let mut buf = [0u8; 64];
                            while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                        }
                    }
                }
            }
            Err(e) => {
                let name = e.raw_os_error().map(errno_name).unwrap_or_else(|| format!("{:?}", e.kind()));
                *errors.entry(name).or_default() += 1;
            }
        }
    }
    let errors: Vec<String> = errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!("connected={connected} errors={}", errors.join(","));
    if hold == Hold::UntilEof {
        let _ = std::io::stdout().flush();
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
    }
    for s in &held {
        let _ = s.shutdown(Shutdown::Both);
    }
}

/// How `connect` opens a connection other than by a blocking connect().
#[derive(Clone, Copy)]
enum Opening {
    Nonblocking(Nonblocking),
    FastOpen,
}

#[derive(Clone, Copy)]
struct Nonblocking {
    wait: Duration,
    ask_again: bool,
}

/// connect() without blocking, then after `wait` the socket's pending error
/// (SO_ERROR, or what a second connect() returns), as an event loop would
/// see it. A connection still pending then counts as connected.
fn connect_nonblocking(to: SocketAddr, how: Nonblocking) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, socket};
    let family = if to.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).map_err(std::io::Error::from)?;
    let addr = SockaddrStorage::from(to);
    match nix::sys::socket::connect(fd.as_raw_fd(), &addr) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(e) => return Err(e.into()),
    }
    std::thread::sleep(how.wait);
    if how.ask_again {
        return match nix::sys::socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) | Err(nix::errno::Errno::EISCONN | nix::errno::Errno::EALREADY) => Ok(TcpStream::from(fd)),
            Err(e) => Err(e.into()),
        };
    }
    // What the application would learn: the pending error, if any.
    match nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::SocketError) {
        Ok(0) => Ok(TcpStream::from(fd)),
        Ok(errno) => Err(std::io::Error::from_raw_os_error(errno)),
        Err(e) => Err(e.into()),
    }
}

/// A blocking sendto(MSG_FASTOPEN) of one byte on a new socket: the kernel
/// sends the SYN (with a cookie request, or the byte and a cookie) and
/// returns once the connection is open and the byte queued.
fn connect_fast_open(to: SocketAddr) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrLike, SockaddrStorage, socket};
    let family = if to.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(family, SockType::Stream, SockFlag::empty(), None).map_err(std::io::Error::from)?;
    let addr = SockaddrStorage::from(to);
    // SAFETY: a valid socket, a one-byte buffer and a sockaddr of `len()`
    // bytes, all alive for the call. (nix has no MSG_FASTOPEN flag.)
    let sent = unsafe {
        nix::libc::sendto(fd.as_raw_fd(), b"x".as_ptr().cast(), 1, nix::libc::MSG_FASTOPEN, addr.as_ptr(), addr.len())
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(TcpStream::from(fd))
}

fn errno_name(errno: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(errno))
}
