//! Volatile-token masking as a policy configures it: the classes of
//! tokens masked, and whether tool-call arguments are masked too. The
//! masking itself is [`crate::request::llm::volatile`].

/// A class of volatile token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "VolatileClass", transform = super::raw::names_only))]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// `8-4-4-4-12` hex digits: `<uuid>`.
    Uuid,
    /// RFC 3339 / ISO 8601 dates and date-times, with fractions and zones:
    /// `<datetime>` (with a time), `<date>` (a bare date, tool results and
    /// opted-in arguments only).
    #[serde(rename = "datetime")]
    DateTime,
    /// Unix epoch seconds (10 digits) or milliseconds (13 digits) between
    /// 2001 and 2036: `<epoch>`.
    Epoch,
    /// 16 or more hex digits (hashes, trace ids): `<hex>`.
    Hex,
    /// A short alphabetic prefix, `_` or `-`, then 10 or more letters and
    /// digits mixed (`req_…`, `call_…`, `chatcmpl-…`, `toolu_…`): `<id>`.
    PrefixedId,
    /// Numbers whose context says they are noise, in tool results and the
    /// model's text: durations and latencies (`1843 ms`, `1.04s`,
    /// `10m07s`), times of day (`13:40:01`), the day and year of a written
    /// date (`Nov 23`, `23 Nov 2026`), and the value of a key that names a
    /// time, an attempt or an id (`attempt 4`, `took_ms: 31`, `pid 2231`).
    /// Every other number (counts, percentages, amounts, sizes, line
    /// numbers, status codes) is kept: `5 failed, 20 passed` then `4 failed,
    /// 21 passed` is progress. `#`, as for `ToolResultNumbers`.
    NoiseNumbers,
    /// Every number inside a tool result, whatever it means (counts and
    /// sizes too): `#` (one character: masking never lengthens a text). Not
    /// in the default set: progress that shows only in numbers would read
    /// as the same answer.
    ToolResultNumbers,
}

impl Class {
    pub const ALL: [Class; 7] = [
        Class::Uuid,
        Class::DateTime,
        Class::Epoch,
        Class::Hex,
        Class::PrefixedId,
        Class::NoiseNumbers,
        Class::ToolResultNumbers,
    ];

    /// Whether the class masks numbers (never in a call's arguments).
    pub fn is_numbers(self) -> bool {
        matches!(self, Class::NoiseNumbers | Class::ToolResultNumbers)
    }

    pub fn name(self) -> &'static str {
        match self {
            Class::Uuid => "uuid",
            Class::DateTime => "datetime",
            Class::Epoch => "epoch",
            Class::Hex => "hex",
            Class::PrefixedId => "prefixed_id",
            Class::NoiseNumbers => "noise_numbers",
            Class::ToolResultNumbers => "tool_result_numbers",
        }
    }

    #[cfg(test)]
    pub fn from_name(name: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Classes(u8);

impl Classes {
    pub const NONE: Classes = Classes(0);

    pub fn all() -> Classes {
        Class::ALL.into_iter().collect()
    }

    /// The classes masked unless a policy lists its own: every class but
    /// `tool_result_numbers` (numbers that carry meaning are kept).
    pub fn defaults() -> Classes {
        Class::ALL
            .into_iter()
            .filter(|c| *c != Class::ToolResultNumbers)
            .collect()
    }

    pub fn contains(self, c: Class) -> bool {
        self.0 & c.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Class> {
        Class::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

impl FromIterator<Class> for Classes {
    fn from_iter<I: IntoIterator<Item = Class>>(iter: I) -> Self {
        Classes(iter.into_iter().fold(0, |acc, c| acc | c.bit()))
    }
}

/// A policy's masking: the classes, and whether tool-call arguments are
/// masked too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volatile {
    pub classes: Classes,
    pub tool_arguments: bool,
}

impl Volatile {
    pub const OFF: Volatile = Volatile {
        classes: Classes::NONE,
        tool_arguments: false,
    };

    /// The default classes in text and tool results; arguments as they
    /// are.
    pub fn default_on() -> Volatile {
        Volatile {
            classes: Classes::defaults(),
            tool_arguments: false,
        }
    }

    /// The classes that apply to tool-call arguments (never numbers).
    pub fn argument_classes(&self) -> Classes {
        if self.tool_arguments {
            self.classes.iter().filter(|c| !c.is_numbers()).collect()
        } else {
            Classes::NONE
        }
    }
}
