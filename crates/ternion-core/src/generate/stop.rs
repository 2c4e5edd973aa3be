//! Stop sequences over streamed text: text that might be the start of a stop sequence is
//! held back until it is known not to be one, and a stop sequence itself is never emitted.

/// Filters streamed text against a set of stop sequences.
#[derive(Debug, Default)]
pub struct StopFilter {
    stops: Vec<String>,
    held: String,
}

/// What one [`StopFilter::push`] produced.
#[derive(Debug, PartialEq, Eq)]
pub struct Filtered {
    /// Text that is safe to send now.
    pub text: String,
    /// A stop sequence was found: generation should end (nothing after it is sent).
    pub stopped: bool,
}

impl StopFilter {
    /// A filter for `stops`; empty strings are ignored.
    pub fn new(stops: Vec<String>) -> StopFilter {
        StopFilter {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds newly generated text.
    pub fn push(&mut self, piece: &str) -> Filtered {
        if self.stops.is_empty() {
            return Filtered {
                text: piece.to_owned(),
                stopped: false,
            };
        }
        self.held.push_str(piece);
        // The earliest stop sequence wins.
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = hit {
            let text = self.held[..at].to_owned();
            self.held.clear();
            return Filtered {
                text,
                stopped: true,
            };
        }
        // Hold back the longest suffix that is a proper prefix of some stop sequence.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep_from);
        let text = std::mem::replace(&mut self.held, rest);
        Filtered {
            text,
            stopped: false,
        }
    }

    /// Generation ended without a stop sequence: returns the held-back text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = f.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&f.finish());
        (out, false)
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn stop_split_over_pieces_is_removed() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn false_start_is_released() {
        let mut f = StopFilter::new(vec!["END".into()]);
        assert_eq!(f.push("xE").text, "x");
        assert_eq!(f.push("Nx").text, "ENx");
        assert_eq!(f.finish(), "");
        assert_eq!(run(&["END"], &["E", "N"]), ("EN".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["c", "ab"], &["xabc"]), ("x".into(), true));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "é!"]), ("café".into(), true));
        assert_eq!(run(&["éa"], &["ééb"]), ("ééb".into(), false));
    }
}
