//! Pure: what the node label means. The label (`--node-label`, value `true` or `false`)
//! turns the bypass on and off; without it `--default-enabled` decides. A value other
//! than `true`/`false` is an error the caller logs and counts, and the current state is
//! kept, so a typo never flips the datapath.

use std::collections::BTreeMap;

pub use bypass_common::status::{EnabledBy, LabelValue};

/// A decision: on or off, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the bypass should be attached.
    pub enabled: bool,
    /// Where that came from.
    pub by: EnabledBy,
}

/// A label value that is neither `true` nor `false`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {node} has label {key}={value:?}, which is neither \"true\" nor \"false\": keeping the bypass {kept}; fix it with `kubectl label node {node} {key}=true --overwrite` (or =false)",
    kept = if *.kept_enabled { "on" } else { "off" }
)]
pub struct BadLabelValue {
    /// The node.
    pub node: String,
    /// The label key.
    pub key: String,
    /// The value found.
    pub value: String,
    /// The state that is kept.
    pub kept_enabled: bool,
}

/// Parses a label value: exactly `true` or `false` (as Kubernetes writes booleans).
pub fn parse_value(value: &str) -> Option<bool> {
    match value {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

/// What the node's labels mean for the bypass. `current` is the state now, kept and
/// reported in the error when the value is bad.
pub fn decide(
    node: &str,
    labels: Option<&BTreeMap<String, String>>,
    key: &str,
    default_enabled: bool,
    current: bool,
) -> Result<Decision, BadLabelValue> {
    match labels.and_then(|l| l.get(key)) {
        None => Ok(Decision {
            enabled: default_enabled,
            by: EnabledBy::Default,
        }),
        Some(value) => match parse_value(value) {
            Some(enabled) => Ok(Decision {
                enabled,
                by: EnabledBy::Label,
            }),
            None => Err(BadLabelValue {
                node: node.to_owned(),
                key: key.to_owned(),
                value: value.clone(),
                kept_enabled: current,
            }),
        },
    }
}

/// What to do to the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Attach sock_ops and allow redirects.
    Attach,
    /// Stop redirects and detach.
    Detach,
    /// Nothing changes.
    Keep,
}

/// The action that takes the datapath from `attached` to what `decision` wants; a bad
/// label value keeps it.
pub fn action(attached: bool, decision: &Result<Decision, BadLabelValue>) -> Action {
    match decision {
        Ok(d) if d.enabled && !attached => Action::Attach,
        Ok(d) if !d.enabled && attached => Action::Detach,
        _ => Action::Keep,
    }
}

/// The label value as found on a node's labels.
pub fn label_value(labels: Option<&BTreeMap<String, String>>, key: &str) -> LabelValue {
    match labels.and_then(|l| l.get(key)).map(|v| parse_value(v)) {
        None => LabelValue::Absent,
        Some(Some(true)) => LabelValue::True,
        Some(Some(false)) => LabelValue::False,
        Some(None) => LabelValue::Invalid,
    }
}

/// The Kubernetes agent's view of the toggle, kept in the datapath's agent state word
/// so that `status`, another process, can read it from the pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Where the current on/off state came from; `None` until a valid decision was made
    /// (a bad label value at start keeps the bypass off).
    pub enabled_by: Option<EnabledBy>,
    /// What the label held at the last reconcile.
    pub label: LabelValue,
    /// Whether the watchers had listed everything.
    pub synced: bool,
}

/// High byte of a recorded word: tells a word written by the Kubernetes agent from the
/// zero a standalone agent leaves.
const RECORD_MARK: u32 = 0xB5 << 24;

impl Recorded {
    /// The state word.
    pub fn encode(&self) -> u32 {
        let by = match self.enabled_by {
            None => 0,
            Some(EnabledBy::Label) => 1,
            Some(EnabledBy::Default) => 2,
        };
        let label = match self.label {
            LabelValue::Absent => 0,
            LabelValue::True => 1,
            LabelValue::False => 2,
            LabelValue::Invalid => 3,
        };
        RECORD_MARK | by | (label << 4) | (u32::from(self.synced) << 8)
    }

    /// Reads a state word; `None` when no Kubernetes agent wrote it.
    pub fn decode(word: u32) -> Option<Self> {
        if word & 0xff00_0000 != RECORD_MARK {
            return None;
        }
        let enabled_by = match word & 0xf {
            1 => Some(EnabledBy::Label),
            2 => Some(EnabledBy::Default),
            _ => None,
        };
        let label = match (word >> 4) & 0xf {
            1 => LabelValue::True,
            2 => LabelValue::False,
            3 => LabelValue::Invalid,
            _ => LabelValue::Absent,
        };
        Some(Self {
            enabled_by,
            label,
            synced: word & (1 << 8) != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "bypass.dev/enabled";

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn label_true_and_false() {
        let on = labels(&[(KEY, "true")]);
        let off = labels(&[(KEY, "false")]);
        for default in [true, false] {
            assert_eq!(
                decide("n1", Some(&on), KEY, default, false),
                Ok(Decision {
                    enabled: true,
                    by: EnabledBy::Label
                })
            );
            assert_eq!(
                decide("n1", Some(&off), KEY, default, true),
                Ok(Decision {
                    enabled: false,
                    by: EnabledBy::Label
                })
            );
        }
    }

    #[test]
    fn absent_label_uses_default() {
        let other = labels(&[("kubernetes.io/os", "linux")]);
        for default in [true, false] {
            for l in [None, Some(&other)] {
                assert_eq!(
                    decide("n1", l, KEY, default, !default),
                    Ok(Decision {
                        enabled: default,
                        by: EnabledBy::Default
                    })
                );
            }
        }
    }

    #[test]
    fn bad_values_are_errors_that_keep_state() {
        for bad in ["True", "FALSE", "yes", "1", "", " true", "on"] {
            for current in [true, false] {
                let l = labels(&[(KEY, bad)]);
                let err = decide("node-a", Some(&l), KEY, true, current).unwrap_err();
                assert_eq!(err.value, bad);
                assert_eq!(err.kept_enabled, current);
                let msg = err.to_string();
                assert!(msg.contains("node-a"), "{msg}");
                assert!(msg.contains(KEY), "{msg}");
                assert!(msg.contains("--overwrite"), "{msg}");
                assert_eq!(action(current, &Err(err)), Action::Keep);
            }
        }
    }

    #[test]
    fn other_keys_do_not_count() {
        let l = labels(&[
            ("bypass.dev/enabledx", "false"),
            ("example.com/enabled", "false"),
        ]);
        assert_eq!(
            decide("n", Some(&l), KEY, true, true).map(|d| d.enabled),
            Ok(true)
        );
    }

    #[test]
    fn actions() {
        let on = Ok(Decision {
            enabled: true,
            by: EnabledBy::Label,
        });
        let off = Ok(Decision {
            enabled: false,
            by: EnabledBy::Default,
        });
        assert_eq!(action(false, &on), Action::Attach);
        assert_eq!(action(true, &on), Action::Keep);
        assert_eq!(action(true, &off), Action::Detach);
        assert_eq!(action(false, &off), Action::Keep);
    }

    #[test]
    fn enabled_by_serializes_lowercase() {
        assert_eq!(
            serde_json::to_string(&EnabledBy::Label).unwrap(),
            "\"label\""
        );
        assert_eq!(
            serde_json::to_string(&EnabledBy::Default).unwrap(),
            "\"default\""
        );
    }
    #[test]
    fn label_value_of() {
        let l = labels(&[(KEY, "true"), ("b", "false"), ("c", "maybe")]);
        assert_eq!(label_value(Some(&l), KEY), LabelValue::True);
        assert_eq!(label_value(Some(&l), "b"), LabelValue::False);
        assert_eq!(label_value(Some(&l), "c"), LabelValue::Invalid);
        assert_eq!(label_value(Some(&l), "d"), LabelValue::Absent);
        assert_eq!(label_value(None, KEY), LabelValue::Absent);
    }

    #[test]
    fn recorded_round_trips() {
        let bys = [None, Some(EnabledBy::Label), Some(EnabledBy::Default)];
        let values = [
            LabelValue::Absent,
            LabelValue::True,
            LabelValue::False,
            LabelValue::Invalid,
        ];
        for enabled_by in bys {
            for label in values {
                for synced in [true, false] {
                    let r = Recorded {
                        enabled_by,
                        label,
                        synced,
                    };
                    assert_eq!(Recorded::decode(r.encode()), Some(r));
                }
            }
        }
    }

    #[test]
    fn unrecorded_word_decodes_to_none() {
        assert_eq!(Recorded::decode(0), None);
        assert_eq!(Recorded::decode(0x0000_0111), None);
    }
}
