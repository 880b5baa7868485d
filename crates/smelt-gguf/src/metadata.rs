//! The key-value section: kept in file order (a rewritten file should read like its source,
//! and `inspect` prints it in order) with a hash index for lookups.

use std::collections::HashMap;

use crate::value::{Array, Value};

/// Ordered metadata: key -> value, in insertion (file) order, with O(1) lookup.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key`, replacing an existing value in place (keeping its position) or appending.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        match self.index.get(&key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.entries.len());
                self.entries.push((key, value));
            }
        }
    }

    /// Removes `key`, keeping the order of the others.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for (k, _) in &self.entries[i..] {
            if let Some(slot) = self.index.get_mut(k) {
                *slot -= 1;
            }
        }
        Some(value)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Entries in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any non-negative integer type, widened.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// Any integer type, widened to i64 when it fits.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// F32, or F64 narrowed.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&Array> {
        self.get(key)?.as_array()
    }

    /// `general.architecture`: the key every other model key is prefixed with.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }
}

impl<K: Into<String>> FromIterator<(K, Value)> for Metadata {
    fn from_iter<I: IntoIterator<Item = (K, Value)>>(iter: I) -> Self {
        let mut m = Self::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_and_index_through_edits() {
        let mut m = Metadata::new();
        m.insert("a", Value::U32(1));
        m.insert("b", Value::from("two"));
        m.insert("c", Value::F64(3.0));
        m.insert("a", Value::U8(9));
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "b", "c"]);
        assert_eq!(m.get_u64("a"), Some(9));

        assert_eq!(m.remove("b"), Some(Value::from("two")));
        assert_eq!(m.remove("b"), None);
        assert_eq!(m.get_f32("c"), Some(3.0));
        assert_eq!(m.len(), 2);
        m.insert("d", Value::Bool(true));
        let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["a", "c", "d"]);
        assert_eq!(m.get_bool("d"), Some(true));
        assert_eq!(m.get_str("a"), None);
    }

    #[test]
    fn architecture_is_general_architecture() {
        let m: Metadata = [("general.architecture", Value::from("gemma3"))]
            .into_iter()
            .collect();
        assert_eq!(m.architecture(), Some("gemma3"));
        assert!(Metadata::new().is_empty());
    }
}
