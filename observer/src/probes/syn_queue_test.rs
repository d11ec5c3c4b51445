//! Whether this kernel's SYN queue is full at its backlog, or only above
//! it. `inet_csk_reqsk_queue_is_full` compared with `>=` until the 2024 fix
//! "tcp/dccp: allow a connection when sk_max_ack_backlog is zero" (Linux
//! 6.13; stable 5.10.234, 6.1.125, 6.12.10, per Debian's changelogs), with
//! `>` since; distributions backport it on schedules of their own, so the
//! version says nothing. The overflow program repeats that test at
//! `tcp_conn_request` (observer-ebpf's overflow.rs): with the wrong one it
//! would miss every SYN dropped at a full queue of an older kernel.
//!
//! So the kernel is asked: in a network namespace of its own, a listener
//! with backlog 0 takes one connection. With `>=` its empty SYN queue is
//! already full, and the kernel answers the SYN with a cookie
//! (TcpExtTCPReqQFullDoCookies 1: a fresh namespace has syncookies 1); with
//! `>` it queues the request (0). The connection completes either way.
use std::{
    io,
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsRawFd,
    time::Duration,
};

use nix::{
    libc,
    sched::{CloneFlags, unshare},
    sys::socket::{AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, listen, socket},
};

/// True if the SYN queue is full at `backlog` requests (`>=`), false if
/// above it (`>`). Runs on a thread of its own, which alone enters the new
/// namespace; the namespace goes with its sockets.
pub fn full_at_backlog() -> Result<bool, String> {
    let asked = std::thread::Builder::new()
        .name("observer-synq".into())
        .spawn(|| ask_the_kernel().map_err(|e| e.to_string()))
        .map_err(|e| e.to_string())?;
    asked.join().map_err(|_| "the test thread panicked".to_string())?
}

fn ask_the_kernel() -> io::Result<bool> {
    unshare(CloneFlags::CLONE_NEWNET).map_err(|e| io::Error::other(format!("unshare(CLONE_NEWNET): {e}")))?;
    loopback_up()?;
    let listener = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(listener.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)))?;
    // listen(2) takes 0 as a backlog of 0 (std's TcpListener asks 128).
    listen(&listener, Backlog::new(0).map_err(io::Error::from)?)?;
    let listener = TcpListener::from(listener);
    let before = syn_cookies_for_a_full_queue()?;
    // Connected means the SYN was answered: the kernel has decided. (No
    // accept(): nothing here may wait on the kernel for ever.)
    let client = TcpStream::connect_timeout(&listener.local_addr()?, Duration::from_secs(2))?;
    let after = syn_cookies_for_a_full_queue()?;
    drop(client);
    Ok(after > before)
}

/// This thread's namespace's TcpExtTCPReqQFullDoCookies.
fn syn_cookies_for_a_full_queue() -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/net/netstat")?;
    crate::node::screen::tcp_ext(&text)
        .and_then(|counter| counter("TCPReqQFullDoCookies"))
        .ok_or_else(|| io::Error::other("/proc/thread-self/net/netstat has no TcpExt TCPReqQFullDoCookies"))
}

/// A new namespace's loopback is down: bring it up (SIOCSIFFLAGS; no
/// netlink crate of ours sets links).
fn loopback_up() -> io::Result<()> {
    let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    // SAFETY: ifreq is plain data; "lo" and its NUL fit its name.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: both ioctls read and write only `req`, of the type they take.
    unsafe {
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
