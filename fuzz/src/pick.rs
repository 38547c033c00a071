//! Structure-aware building blocks for the generators: numbers that favour
//! the edges (0, 1, `u64::MAX`, …) and texts that are usually one of a few
//! valid names but sometimes arbitrary, so inputs reach deep into the
//! command handlers instead of stopping at validation.

use arbitrary::Arbitrary;

/// A `u64` that is small, an edge value, or anything at all.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Number {
    /// 0 ..= 255.
    Small(u8),
    /// One of the values where arithmetic goes wrong.
    Edge(Edge),
    /// Any value.
    Any(u64),
}

/// Values where sums and products overflow or bounds are off by one.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Edge {
    /// 0.
    Zero,
    /// 1.
    One,
    /// `u64::MAX`.
    Max,
    /// `u64::MAX - 1`.
    MaxLessOne,
    /// `i64::MAX`, the largest value that fits a signed clock.
    SignedMax,
    /// `u32::MAX`.
    Max32,
    /// `u64::MAX / 1000`: the largest bucket whose instant fits in
    /// milliseconds.
    MaxBucket,
}

impl Number {
    /// The value.
    pub fn value(self) -> u64 {
        match self {
            Number::Small(small) => u64::from(small),
            Number::Edge(Edge::Zero) => 0,
            Number::Edge(Edge::One) => 1,
            Number::Edge(Edge::Max) => u64::MAX,
            Number::Edge(Edge::MaxLessOne) => u64::MAX - 1,
            Number::Edge(Edge::SignedMax) => i64::MAX.unsigned_abs(),
            Number::Edge(Edge::Max32) => u64::from(u32::MAX),
            Number::Edge(Edge::MaxBucket) => u64::MAX / 1_000,
            Number::Any(any) => any,
        }
    }

    /// The value cut to 32 bits (saturating).
    pub fn value32(self) -> u32 {
        u32::try_from(self.value()).unwrap_or(u32::MAX)
    }
}

/// An `i32` priority: small, an edge, or anything.
#[derive(Arbitrary, Clone, Copy, Debug)]
pub enum Priority {
    /// -128 ..= 127.
    Small(i8),
    /// `i32::MIN`.
    Min,
    /// `i32::MAX`.
    Max,
    /// Any value.
    Any(i32),
}

impl Priority {
    /// The value.
    pub fn value(self) -> i32 {
        match self {
            Priority::Small(small) => i32::from(small),
            Priority::Min => i32::MIN,
            Priority::Max => i32::MAX,
            Priority::Any(any) => any,
        }
    }
}

/// A text that is usually one of a known list, sometimes anything.
#[derive(Arbitrary, Clone, Debug)]
pub enum Text {
    /// The known text at this index (modulo the list's length).
    Known(u8),
    /// Any string.
    Raw(String),
}

impl Text {
    /// The text, choosing from `known` for [`Text::Known`].
    pub fn resolve(&self, known: &[&str]) -> String {
        match self {
            Text::Known(index) => match known.len() {
                0 => String::new(),
                len => known[usize::from(*index) % len].to_owned(),
            },
            Text::Raw(raw) => raw.clone(),
        }
    }
}
