//! A tiny keyed memo for prompt encodings: the last few values by key, so the conditional and
//! negative prompts of a `--batch-count` run are encoded once.

use std::cell::RefCell;

/// The last `capacity` values computed, by key (oldest evicted first).
pub(crate) struct Memo<V> {
    slots: RefCell<Vec<(String, V)>>,
    capacity: usize,
}

impl<V: Clone> Memo<V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            slots: RefCell::new(Vec::new()),
            capacity: capacity.max(1),
        }
    }

    /// The value under `key`, computing and keeping it with `make` when absent.
    pub fn get_or_try<E>(&self, key: &str, make: impl FnOnce() -> Result<V, E>) -> Result<V, E> {
        if let Some((_, v)) = self.slots.borrow().iter().find(|(k, _)| k == key) {
            return Ok(v.clone());
        }
        let v = make()?;
        let mut slots = self.slots.borrow_mut();
        if slots.len() >= self.capacity {
            slots.remove(0);
        }
        slots.push((key.to_string(), v.clone()));
        Ok(v)
    }

    /// Forgets every value (their inputs beyond the key changed, e.g. new references).
    pub fn clear(&self) {
        self.slots.borrow_mut().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::Memo;

    #[test]
    fn keeps_the_last_values_and_computes_once() {
        let m = Memo::new(2);
        let mut calls = 0;
        for key in ["a", "b", "a", "c", "a"] {
            m.get_or_try::<()>(key, || {
                calls += 1;
                Ok(key.len())
            })
            .unwrap();
        }
        // a, b computed; a hit; c evicts a; a recomputed.
        assert_eq!(calls, 4);
    }
}
