//! Where the text being read comes from: errors pointed at
//! `ORIGIN:LINE:COL` (at the key they are about), and the directory its
//! relative paths are relative to.

use std::ops::Range;
use std::path::Path;

use super::super::ConfigError;

/// Make an error about a table point at the key it names, and an error
/// about a value name its key.
///
/// A message about a section (`[options]`, a `[[target.lun]]`) that starts
/// with one of the section's keys (`queue_depth = 0 is outside ...`) is
/// moved to that key's line; a message at a value whose line is
/// `key = value` and that does not mention the key (toml's "invalid type:
/// string, expected a boolean") gets the key in front.
fn point_at_key(
    text: &str,
    span: Option<Range<usize>>,
    msg: String,
) -> (Option<Range<usize>>, String) {
    let Some(span) = span else {
        return (None, msg);
    };
    let first_word: String = msg
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    let end = span.end.min(text.len());
    let start = span.start.min(end);
    if !first_word.is_empty() {
        let mut offset = start;
        for line in text[start..end].split_inclusive('\n') {
            let t = line.trim_start();
            if let Some(rest) = t.strip_prefix(first_word.as_str()) {
                if rest.trim_start().starts_with('=') {
                    let at = offset + (line.len() - t.len());
                    return (Some(at..at + first_word.len()), msg);
                }
            }
            offset += line.len();
        }
    }
    // The line the span starts on, if it is `key = value`.
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("");
    if let Some((key, _)) = line.split_once('=') {
        let key = key.trim();
        let is_key = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if is_key && start > line_start + key.len() && !msg.starts_with(key) {
            return (Some(span), format!("{key}: {msg}"));
        }
    }
    (Some(span), msg)
}

pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rsplit('\n')
        .next()
        .map(|l| l.chars().count())
        .unwrap_or(0)
        + 1;
    (line, col)
}

/// The text being read, to point errors at `ORIGIN:LINE:COL`, and the
/// directory its relative paths are relative to.
pub(super) struct Source<'a> {
    pub(super) text: &'a str,
    pub(super) origin: &'a str,
    pub(super) base: &'a Path,
}

impl Source<'_> {
    /// The error `msg` at `span` (its key when it has one).
    pub(super) fn at(&self, span: Option<Range<usize>>, msg: String) -> ConfigError {
        let (span, msg) = point_at_key(self.text, span, msg);
        let (line, col) = line_col(self.text, span.map(|s| s.start).unwrap_or(0));
        ConfigError::At {
            origin: self.origin.to_string(),
            line,
            col,
            msg,
        }
    }
}
