//! Requests held back by a throttle, waiting for their time.
//!
//! Pure bookkeeping: the host pushes a stream when it pauses it, takes the
//! due ones on every tick to resume them, and removes a stream whose client
//! left. Bounded by the number of streams in flight (each is in at most
//! once).

#[derive(Debug, Default)]
pub struct DelayQueue {
    /// (due time in ms, stream id), unordered: the queue is short and
    /// scanned once per tick.
    waiting: Vec<(u64, u32)>,
}

impl DelayQueue {
    /// Hold `stream` until `due_ms` (a stream already waiting is moved).
    pub fn push(&mut self, stream: u32, due_ms: u64) {
        self.remove(stream);
        self.waiting.push((due_ms, stream));
    }

    /// Forget a stream (its client left); true if it was waiting.
    pub fn remove(&mut self, stream: u32) -> bool {
        let before = self.waiting.len();
        self.waiting.retain(|&(_, s)| s != stream);
        self.waiting.len() != before
    }

    /// The streams due at `now`, earliest first, removed from the queue.
    pub fn take_due(&mut self, now: u64) -> Vec<u32> {
        let mut due: Vec<(u64, u32)> = self.waiting.extract_if(.., |(t, _)| *t <= now).collect();
        due.sort_unstable();
        due.into_iter().map(|(_, s)| s).collect()
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_due_streams_in_time_order() {
        let mut q = DelayQueue::default();
        q.push(7, 300);
        q.push(8, 100);
        q.push(9, 200);
        assert_eq!(q.take_due(99), Vec::<u32>::new());
        assert_eq!(q.take_due(250), vec![8, 9]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.take_due(1_000), vec![7]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_stream_whose_client_left_is_dropped() {
        let mut q = DelayQueue::default();
        q.push(1, 100);
        q.push(2, 100);
        assert!(q.remove(1));
        assert!(!q.remove(1));
        assert_eq!(q.take_due(100), vec![2]);
        // Pushing again moves, never duplicates.
        q.push(3, 50);
        q.push(3, 80);
        assert_eq!(q.len(), 1);
        assert_eq!(q.take_due(60), Vec::<u32>::new());
        assert_eq!(q.take_due(80), vec![3]);
    }
}
