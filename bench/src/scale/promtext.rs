//! Reading Prometheus text (pure): the API server's and the agent's `/metrics`.

use std::collections::BTreeMap;

/// The value of every series of metric `name` whose labels include all of `with`,
/// summed by the value of label `by` (`""` when the series has no such label).
pub fn sum_by(text: &str, name: &str, with: &[(&str, &str)], by: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, labels) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let labels = parse_labels(labels);
        let get = |k: &str| {
            labels
                .iter()
                .find(|(l, _)| *l == k)
                .map(|(_, v)| v.as_str())
        };
        if with.iter().all(|(k, v)| get(k) == Some(*v)) {
            *out.entry(get(by).unwrap_or("").to_owned()).or_insert(0.0) += value;
        }
    }
    out
}

/// The sum of every series of `name` whose labels include all of `with`.
pub fn total(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    sum_by(text, name, with, "").values().sum()
}

/// `k="v",k2="v2"` into pairs (values hold no escaped quotes in what is read here).
fn parse_labels(s: &str) -> Vec<(&str, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let Some((v, tail)) = after.split_once('"') else {
            break;
        };
        out.push((k.trim_start_matches(',').trim(), v.to_owned()));
        rest = tail;
    }
    out
}

/// Differences `after - before` by key (keys of either).
pub fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .keys()
        .chain(before.keys())
        .map(|k| {
            let d = after.get(k).copied().unwrap_or(0.0) - before.get(k).copied().unwrap_or(0.0);
            (k.clone(), d)
        })
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_longrunning_requests x
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 2
apiserver_longrunning_requests{component="apiserver",group="",resource="services",scope="cluster",subresource="",verb="WATCH",version="v1"} 1
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="cluster",subresource="log",verb="CONNECT",version="v1"} 5
bypass_reconciles_total 42
"#;

    #[test]
    fn series_are_summed_by_a_label_and_filtered_by_others() {
        let w = sum_by(
            TEXT,
            "apiserver_longrunning_requests",
            &[("verb", "WATCH")],
            "resource",
        );
        assert_eq!(w.get("pods"), Some(&2.0));
        assert_eq!(w.get("services"), Some(&1.0));
        assert_eq!(
            total(TEXT, "apiserver_longrunning_requests", &[("verb", "WATCH")]),
            3.0
        );
        assert_eq!(total(TEXT, "bypass_reconciles_total", &[]), 42.0);
        assert_eq!(total(TEXT, "bypass_reconciles", &[]), 0.0);
    }

    #[test]
    fn deltas_keep_what_moved() {
        let b = BTreeMap::from([("a".to_owned(), 1.0), ("b".to_owned(), 2.0)]);
        let a = BTreeMap::from([("a".to_owned(), 4.0), ("b".to_owned(), 2.0)]);
        assert_eq!(delta(&b, &a), BTreeMap::from([("a".to_owned(), 3.0)]));
    }
}
