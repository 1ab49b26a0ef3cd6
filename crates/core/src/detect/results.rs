//! Where the judges read a conversation's tool results and the model's
//! replies: the request itself, or a stand-in in tests. The tool-loop
//! judge, the progress rules and what a repeated call adds all read
//! through it.

use crate::request::llm::{Request, ResultAt};

pub trait Results {
    /// The text at `at`, normalised; `None` when it cannot be read (the
    /// request's parsing budget ran out).
    fn result_text(&self, at: ResultAt) -> Option<String>;

    /// The text at `at` as written (its lines and case kept, for telling
    /// what a repeated call's result adds; see `news.rs`); `None` when it
    /// cannot be read.
    fn result_raw(&self, at: ResultAt) -> Option<String> {
        self.result_text(at)
    }

    /// What a model's reply at `at` wrote as text, normalised: its text
    /// parts only (a native call is not text the model wrote).
    fn reply_words(&self, at: ResultAt) -> Option<String> {
        self.result_text(at)
    }

    /// The bytes in the body of the text at `at` (a cache's key); `None`
    /// when there are none to key on.
    fn result_bytes(&self, _at: ResultAt) -> Option<&[u8]> {
        None
    }

    /// Take from the parsing budget what reading the text at `at` takes
    /// (when it is found in a cache instead); false when it does not fit.
    fn afford_result(&self, _at: ResultAt) -> bool {
        true
    }
}

impl Results for Request<'_> {
    fn result_text(&self, at: ResultAt) -> Option<String> {
        Request::result_text(self, at)
    }

    fn result_raw(&self, at: ResultAt) -> Option<String> {
        Request::result_raw(self, at)
    }

    fn reply_words(&self, at: ResultAt) -> Option<String> {
        Request::reply_words(self, at)
    }

    fn result_bytes(&self, at: ResultAt) -> Option<&[u8]> {
        Request::result_bytes(self, at)
    }

    fn afford_result(&self, at: ResultAt) -> bool {
        Request::afford_result(self, at)
    }
}
