//! The node's JSON log lines: one object per line, as `tracing-subscriber`'s JSON format writes
//! it (`timestamp`, `level`, `fields`, `target`), except that the fields of the spans an event
//! happens in (a run's job, tick and fence, an attempt's number, a term's shard) are keys of
//! `fields` too. Log pipelines read `fields.job` whether a line names the job itself or its
//! span does, as they did before the run path had spans.

use std::fmt;

use serde::ser::SerializeMap;
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The span fields' format to pair with [`JsonWithSpans`]: spans keep their fields as JSON,
/// which each event's line merges into its own.
pub fn span_fields() -> JsonFields {
    JsonFields::new()
}

/// The event format of `--log-format json`; see the module's doc.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonWithSpans;

impl<S> FormatEvent<S, JsonFields> for JsonWithSpans
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        // Events from the `log` crate name their own target and level, as the stock format shows.
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        let mut fields = EventFields::default();
        event.record(&mut fields);
        if let Some(scope) = ctx.event_scope() {
            for span in scope {
                let extensions = span.extensions();
                if let Some(stored) = extensions.get::<FormattedFields<JsonFields>>() {
                    fields.add_span_fields(&stored.fields);
                }
            }
        }
        let line = Line {
            timestamp: &timestamp,
            level: meta.level().as_str(),
            fields: &fields.0,
            target: meta.target(),
        };
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// One log line, its keys in the stock format's order.
struct Line<'a> {
    timestamp: &'a str,
    level: &'a str,
    fields: &'a [(String, Value)],
    target: &'a str,
}

impl serde::Serialize for Line<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("timestamp", self.timestamp)?;
        map.serialize_entry("level", self.level)?;
        map.serialize_entry("fields", &Fields(self.fields))?;
        map.serialize_entry("target", self.target)?;
        map.end()
    }
}

struct Fields<'a>(&'a [(String, Value)]);

impl serde::Serialize for Fields<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(name, value)| (name, value)))
    }
}

/// An event's fields in the order it names them, then its spans' fields, innermost span first.
/// A name already there keeps its value: an event's own field wins over its span's, and an
/// inner span's over an outer one's.
#[derive(Default)]
struct EventFields(Vec<(String, Value)>);

impl EventFields {
    fn insert(&mut self, name: &str, value: Value) {
        if !self.0.iter().any(|(have, _)| have == name) {
            self.0.push((name.to_string(), value));
        }
    }

    /// Adds the fields a span stored as a JSON object (an empty string if it has none).
    fn add_span_fields(&mut self, stored: &str) {
        if let Ok(serde_json::Value::Object(span_fields)) = serde_json::from_str::<Value>(stored) {
            for (name, value) in span_fields {
                self.insert(&name, value);
            }
        }
    }
}

/// Values as the stock format writes them: numbers and booleans as JSON's, the rest as text.
impl Visit for EventFields {
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.insert(field.name(), Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.insert(field.name(), Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.insert(field.name(), Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.insert(field.name(), Value::from(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.insert(field.name(), Value::from(value));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.insert(field.name(), Value::from(format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    impl Captured {
        /// The lines written, parsed, without their timestamps (which differ between runs).
        fn lines(&self) -> Vec<serde_json::Map<String, Value>> {
            let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|line| {
                    let Value::Object(mut object) = serde_json::from_str(line).unwrap() else {
                        panic!("not an object: {line}")
                    };
                    assert!(object.remove("timestamp").is_some_and(|at| at.is_string()), "{line}");
                    object
                })
                .collect()
        }
    }

    fn ours(events: impl FnOnce()) -> Captured {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(span_fields())
            .event_format(JsonWithSpans)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        out
    }

    fn stock(events: impl FnOnce()) -> Captured {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(false)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, events);
        out
    }

    fn events_without_spans() {
        let error = std::io::Error::other("refused");
        tracing::info!(job = %"a", fence = 4_i64, took = 1.5, ok = true, waited = ?std::time::Duration::from_millis(3), "run succeeded");
        tracing::warn!(stream = "stderr", count = 7_u64, error = %error, "line with \"quotes\" and \\");
        tracing::error!("no fields");
    }

    #[test]
    fn a_line_outside_spans_is_the_stock_formats_line() {
        let (ours, stock) = (ours(events_without_spans).lines(), stock(events_without_spans).lines());
        assert_eq!(ours.len(), 3);
        assert_eq!(ours, stock);
    }

    #[test]
    fn the_keys_come_in_the_stock_formats_order() {
        let out = ours(|| tracing::info!(job = "a", "hello"));
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let keys: Vec<usize> = ["\"timestamp\":", "\"level\":", "\"fields\":", "\"target\":"]
            .iter()
            .map(|key| text.find(key).expect(key))
            .collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{text}");
        assert!(text.ends_with("}\n") && text.lines().count() == 1, "{text}");
    }

    #[test]
    fn the_fields_of_enclosing_spans_are_keys_of_fields() {
        let out = ours(|| {
            let run = tracing::error_span!("run", job = %"backup", tick = %"2026-01-01T00:00:00Z", fence = 42_i64);
            let _run = run.enter();
            tracing::info!("replacing");
            let attempt = tracing::error_span!("attempt", attempt = 2_u32);
            attempt.in_scope(|| tracing::info!(stream = "stdout", "hello"));
        });
        let lines = out.lines();
        let fields = |line: usize| lines[line]["fields"].as_object().unwrap().clone();
        let first = fields(0);
        assert_eq!(first["message"], "replacing");
        assert_eq!(first["job"], "backup");
        assert_eq!(first["tick"], "2026-01-01T00:00:00Z");
        assert_eq!(first["fence"], 42);
        assert!(!first.contains_key("attempt"));
        let second = fields(1);
        assert_eq!(
            (
                &second["message"],
                &second["stream"],
                &second["attempt"],
                &second["job"],
                &second["fence"]
            ),
            (
                &Value::from("hello"),
                &Value::from("stdout"),
                &Value::from(2),
                &Value::from("backup"),
                &Value::from(42)
            )
        );
        assert!(lines
            .iter()
            .all(|line| !line.contains_key("spans") && !line.contains_key("span")));
        assert_eq!(lines[1]["level"], "INFO");
    }

    #[test]
    fn an_events_own_field_wins_over_its_spans_and_an_inner_span_over_an_outer() {
        let out = ours(|| {
            let outer = tracing::error_span!("term", shard = 1_u32, term = 7_i64);
            let inner = tracing::error_span!("run", shard = 2_u32);
            let _outer = outer.enter();
            let _inner = inner.enter();
            tracing::info!(term = 8_i64, "override");
        });
        let fields = out.lines()[0]["fields"].as_object().unwrap().clone();
        assert_eq!((&fields["shard"], &fields["term"]), (&Value::from(2), &Value::from(8)));
    }

    #[test]
    fn a_field_recorded_on_a_span_later_shows_too() {
        let out = ours(|| {
            let run = tracing::error_span!("run", job = "a", pid = tracing::field::Empty);
            run.record("pid", 12_u64);
            run.in_scope(|| tracing::info!("started"));
        });
        assert_eq!(out.lines()[0]["fields"]["pid"], 12);
    }
}
