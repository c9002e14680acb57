//! The label selectors of external metrics requests (`labelSelector=model=x`),
//! in Kubernetes' string form. The figures carry one label, `model`, so a
//! selector is matched against a model name.

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector; the empty one selects everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses `k=v,k!=v,k in (a,b),k notin (a),k,!k` (`==` is `=`).
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            requirements.push(requirement(part)?);
        }
        Ok(Selector(requirements))
    }

    /// Whether a series with `labels` (name, value pairs) is selected.
    pub fn matches(&self, labels: &[(&str, &str)]) -> bool {
        let get = |key: &str| labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, values) => get(k).is_some_and(|found| values.iter().any(|v| v == found)),
            Requirement::NotIn(k, values) => get(k).is_none_or(|found| values.iter().all(|v| v != found)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::DoesNotExist(k) => get(k).is_none(),
        })
    }
}

/// Splits at commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn requirement(part: &str) -> Result<Requirement, String> {
    let bad = || format!("labelSelector: cannot parse {part:?}");
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::DoesNotExist(key_of(key.trim()).ok_or_else(bad)?));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return Ok(Requirement::NotEquals(
            key_of(key).ok_or_else(bad)?,
            value.trim().to_string(),
        ));
    }
    if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
        return Ok(Requirement::Equals(
            key_of(key).ok_or_else(bad)?,
            value.trim().to_string(),
        ));
    }
    for (word, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, values)) = part.split_once(word) {
            let key = key_of(key).ok_or_else(bad)?;
            let values = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .ok_or_else(bad)?
                .split(',')
                .map(|v| v.trim().to_string())
                .collect();
            return Ok(if negated {
                Requirement::NotIn(key, values)
            } else {
                Requirement::In(key, values)
            });
        }
    }
    Ok(Requirement::Exists(key_of(part).ok_or_else(bad)?))
}

/// A label key: letters, digits, `-_./`, not empty.
fn key_of(text: &str) -> Option<String> {
    let key = text.trim();
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    valid.then(|| key.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selects(selector: &str, model: &str) -> bool {
        Selector::parse(selector).unwrap().matches(&[("model", model)])
    }

    #[test]
    fn the_forms_kubernetes_writes() {
        assert!(selects("", "a"));
        assert!(selects("model=a", "a"));
        assert!(selects("model==a", "a"));
        assert!(!selects("model=a", "b"));
        assert!(selects("model!=a", "b"));
        assert!(selects("model in (a, b)", "b"));
        assert!(!selects("model notin (a,b)", "b"));
        assert!(selects("model", "a"));
        assert!(!selects("!model", "a"));
        assert!(!selects("model=a,team=x", "a"), "a label the series lacks");
        assert!(selects("model in (a,b),model!=b", "a"));
    }

    #[test]
    fn nonsense_is_refused() {
        assert!(Selector::parse("model in a,b").is_err());
        assert!(Selector::parse("=a").is_err());
        assert!(Selector::parse("mo del=a").is_err());
    }
}
