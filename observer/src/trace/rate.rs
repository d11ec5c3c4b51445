//! At most N lines a second: a storm of 50,000 failures a second stays
//! readable and cheap to print, and the events left out are counted, never
//! silently dropped.
use std::time::{Duration, Instant};

pub struct RateLimit {
    per_second: u64,
    window: Instant,
    shown: u64,
    left_out: u64,
}

impl RateLimit {
    pub fn new(per_second: u64, now: Instant) -> Self {
        Self { per_second, window: now, shown: 0, left_out: 0 }
    }

    /// Whether to print an event seen at `now`.
    pub fn admit(&mut self, now: Instant) -> bool {
        if now.duration_since(self.window) >= Duration::from_secs(1) {
            self.window = now;
            self.shown = 0;
        }
        if self.shown < self.per_second {
            self.shown += 1;
            true
        } else {
            self.left_out += 1;
            false
        }
    }

    /// The events left out since the last call.
    pub fn take_left_out(&mut self) -> u64 {
        std::mem::take(&mut self.left_out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_n_a_second_and_the_rest_counted() {
        let t0 = Instant::now();
        let mut limit = RateLimit::new(3, t0);
        let shown = (0..10).filter(|_| limit.admit(t0)).count();
        assert_eq!((shown, limit.take_left_out()), (3, 7));
        assert_eq!(limit.take_left_out(), 0, "taken once");
        assert!(limit.admit(t0 + Duration::from_secs(1)), "a new second");
    }
}
