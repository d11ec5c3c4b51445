//! The lock between the loads of observer's programs in one test binary.
//!
//! While a tool attaches programs to, or detaches them from, a tracepoint
//! observer counts at, the kernel runs a block of the programs already
//! attached there not at all, and counts no skipped run (BENCHMARKS.md
//! history 25: daemons started and stopped beside a 10,000-connection churn
//! cost it 9-85 TIME_WAIT entries). A test that asserts an exact count
//! must therefore never count while another test's load comes or goes.
//! Two kinds of load:
//!
//! - the binary's shared load (`Observer::start`) attaches once, before
//!   its first reader, and stays: its readers count side by side
//!   (`read_shared`);
//! - a load of a test's own (`Observer::start_own`, a daemon, a trace)
//!   attaches at its start and detaches at its end, so it runs alone, from
//!   before its attach to after its detach (`own_load`).
//!
//! Only the host's suite runs tests side by side (libtest's threads); the
//! kernel matrix's guests run one at a time, where this costs nothing.
//!
//! Both are reentrant on one thread (a test with two daemons, or a daemon
//! and a reader of the shared load it started first); a thread that reads
//! the shared load and then asks for a load of its own would wait for
//! itself, and panics instead. A guard is released on the thread that took
//! it (it is not `Send`). Waiting own loads go before new readers, so a
//! stream of readers cannot hold a daemon test back to the end.
use std::{
    cell::Cell,
    marker::PhantomData,
    sync::{Condvar, Mutex, MutexGuard},
    thread::ThreadId,
};

struct State {
    /// Threads' guards on the shared load, by all threads.
    readers: usize,
    /// The thread whose own load runs, and how many guards it holds.
    owner: Option<(ThreadId, usize)>,
    /// Own loads waiting for the readers (or another own load) to end.
    owners_waiting: usize,
}

static STATE: Mutex<State> = Mutex::new(State { readers: 0, owner: None, owners_waiting: 0 });
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread's guards on the shared load.
    static READING: Cell<usize> = const { Cell::new(0) };
}

/// A failed test poisons nothing here: the state is kept by guards, which
/// unwind too.
fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn wait(state: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    CHANGED.wait(state).unwrap_or_else(|e| e.into_inner())
}

/// A reader of the binary's shared load: no load of a test's own comes or
/// goes while one is held.
pub struct SharedReader {
    _not_send: PhantomData<*const ()>,
}

pub fn read_shared() -> SharedReader {
    let me = std::thread::current().id();
    let mut state = state();
    // A thread already reading goes on, even past a waiting own load (that
    // load waits for this thread's first guard anyway), and so does the
    // thread whose own load runs.
    let mine = READING.get() > 0 || state.owner.is_some_and(|(owner, _)| owner == me);
    while !mine && (state.owner.is_some() || state.owners_waiting > 0) {
        state = wait(state);
    }
    state.readers += 1;
    READING.set(READING.get() + 1);
    SharedReader { _not_send: PhantomData }
}

impl Drop for SharedReader {
    fn drop(&mut self) {
        state().readers -= 1;
        READING.set(READING.get() - 1);
        CHANGED.notify_all();
    }
}

/// A load of this test's own: alone from before its attach to after its
/// detach (drop the guard after the load is gone).
pub struct OwnLoad {
    _not_send: PhantomData<*const ()>,
}

pub fn own_load() -> OwnLoad {
    let me = std::thread::current().id();
    let mut state = state();
    if let Some((owner, guards)) = &mut state.owner
        && *owner == me
    {
        *guards += 1;
        return OwnLoad { _not_send: PhantomData };
    }
    assert!(
        READING.get() == 0,
        "this test reads the shared load (Observer::start) and then asks for a load of its own, whose attach \
         would cost the shared load's counts a block of events: take the own load first, or read it instead"
    );
    state.owners_waiting += 1;
    while state.owner.is_some() || state.readers > 0 {
        state = wait(state);
    }
    state.owners_waiting -= 1;
    state.owner = Some((me, 1));
    OwnLoad { _not_send: PhantomData }
}

impl Drop for OwnLoad {
    fn drop(&mut self) {
        let mut state = state();
        let (_, guards) = state.owner.as_mut().expect("an own load's guard outlived its owner");
        *guards -= 1;
        if *guards == 0 {
            state.owner = None;
            drop(state);
            CHANGED.notify_all();
        }
    }
}
