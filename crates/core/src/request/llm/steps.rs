//! The conversation read by steps and turns: tails that reach back from
//! their first results to the calls those answer, where the model's turns
//! began (each the end of the request sent before it), and the messages a
//! user wrote between them.

use super::{scan, Format, Items, Message, Request};
use crate::config::MAX_STEP_EXTENSION;

impl Request<'_> {
    /// The last `n` messages as whole steps: a tail that would begin with
    /// tool results reaches back over them to the calls they answer (an
    /// agent's parallel calls come back one result a message, so the last
    /// 3 messages can hold results with none of their calls, and two fan-
    /// outs to different services would look alike), at most
    /// [`MAX_STEP_EXTENSION`] messages more, of the conversation as it was
    /// before item `end` (`usize::MAX`: all of it). Near mode compares such
    /// tails.
    pub fn tail_of_steps_before(&self, n: usize, end: usize) -> Option<Vec<Message>> {
        let Items::List(_) = &self.items else {
            return self.tail_before(n, end);
        };
        let at = self.tail_of_steps_at(n, end)?.into_iter();
        at.map(|at| self.message_at(at)).collect()
    }

    /// Where the messages of [`Request::tail_of_steps_before`] are, oldest
    /// first: an item's index, or `None` for the out-of-band system prompt
    /// (a caller comparing several tails reads each message once). `None`
    /// when the conversation is one string, or a message cannot be read.
    pub fn tail_of_steps_at(&self, n: usize, end: usize) -> Option<Vec<Option<usize>>> {
        let items = self.list()?;
        let end = end.min(items.len());
        let mut tail: Vec<Option<usize>> = Vec::with_capacity(n + 1);
        if n > end && self.system.is_some() {
            tail.push(None);
        }
        let start = end.saturating_sub(n);
        tail.extend((start..end).map(Some));
        let first_is_results = match tail.first() {
            Some(Some(i)) => self.item(*i)?.is_results(),
            _ => false,
        };
        if end - start < n || !first_is_results {
            return Some(tail);
        }
        let mut before = Vec::new();
        let mut next = start;
        let mut calls_seen = false;
        while next > 0 && before.len() < MAX_STEP_EXTENSION {
            let i = next - 1;
            let Some(m) = self.item(i) else { break };
            // Results, then the model's turn that called them.
            let take = if calls_seen {
                m.is_model_step()
            } else if m.is_results() {
                true
            } else {
                calls_seen = m.is_model_step();
                calls_seen
            };
            if !take {
                break;
            }
            before.push(Some(i));
            next = i;
        }
        before.reverse();
        before.append(&mut tail);
        Some(before)
    }

    /// The messages a user wrote (not tool results, not a text action's
    /// observation) among the kept items `from..to`, with their indices.
    pub fn user_messages_between(&self, from: usize, to: usize) -> Vec<(usize, Message)> {
        let Items::List(items) = &self.items else {
            return Vec::new();
        };
        let user = |keys: &scan::Picked| self.word(keys, "role").eq_ignore_ascii_case(b"user");
        (from..to.min(items.len()))
            .filter_map(|i| {
                items.get(i).filter(|e| e.1.as_ref().is_some_and(user))?;
                self.item(i).filter(|m| !m.is_results()).map(|m| (i, m))
            })
            .collect()
    }

    /// The message at a place [`Request::tail_of_steps_at`] gave.
    pub fn message_at(&self, at: Option<usize>) -> Option<Message> {
        match at {
            None => self.system.and_then(|sys| self.system_message(sys)),
            Some(i) => self.item(i),
        }
    }
}

impl Request<'_> {
    /// Where the conversation's last model turns began, newest first, at
    /// most `k` of them among the kept items: the request sent before each
    /// held the items before it ([`Request::tail_before`]). Turns are
    /// counted as the tool history counts them: a Responses run of model
    /// items is one turn, each Chat or Anthropic reply another.
    pub fn turn_starts(&self, k: usize) -> Vec<usize> {
        let Items::List(items) = &self.items else {
            return Vec::new();
        };
        let model = |i: usize| {
            items
                .get(i)
                .and_then(|e| e.1.as_ref())
                .is_some_and(|keys| self.written_by_model(keys))
        };
        let responses = self.format == Format::OpenAiResponses;
        let starts = |i: &usize| model(*i) && !(responses && *i > 0 && model(*i - 1));
        let oldest = items.kept().next().map_or(items.len(), |(i, _)| i);
        (oldest..items.len()).rev().filter(starts).take(k).collect()
    }

    /// How many times the conversation's last message, a user's, was sent
    /// again right after itself with no model turn in between (0: it was
    /// not): a harness asking the model again and again with the same
    /// correction, the model's unusable answers left out of the history
    /// ("No tool calls found in the response."). A person does not send
    /// one message twice in a row; an SDK's retry resends the whole body.
    pub fn reasked(&self) -> usize {
        let Items::List(items) = &self.items else {
            return 0;
        };
        let mut last: Option<&[u8]> = None;
        let mut again = 0;
        for (_, (_, keys)) in items.kept().rev() {
            let Some(keys) = keys.as_ref().filter(|k| self.word(k, "role") == b"user") else {
                break;
            };
            let Some(content) = keys.get("content").and_then(|s| self.body.get(s.0..s.1)) else {
                break;
            };
            match last {
                None => last = Some(content),
                Some(l) if l == content => again += 1,
                Some(_) => break,
            }
        }
        again
    }
}
