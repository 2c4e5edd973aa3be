//! What a sequence's output must match, seen from the stepper: a set of allowed next
//! tokens before each draw, and the drawn token after it. The `constrain` feature
//! implements it with grammars (`crate::constrain`); a sequence without one pays nothing.

/// A token mask: bit `i % 32` of word `i / 32` allows token `i`; ids past its end are not
/// allowed.
pub type Mask = [u32];

/// Whether `mask` allows token `id`.
pub fn allows(mask: &Mask, id: u32) -> bool {
    mask.get(id as usize / 32)
        .is_some_and(|w| w & (1 << (id % 32)) != 0)
}

/// A rule over the generated tokens, stepped once per draw.
pub trait Constraint: Send {
    /// The tokens allowed next (end-of-generation tokens among them once the output may
    /// end), where `left` more tokens fit in the budget: a rule may steer towards an end
    /// when few are left. Fails when the rule cannot go on.
    fn mask(&mut self, left: usize) -> Result<&Mask, String>;
    /// Records the drawn token `id`. Returns true when the output is complete: nothing
    /// may follow it.
    fn commit(&mut self, id: u32) -> Result<bool, String>;
    /// Whether the rule cut the output short to fit the budget (then a complete output
    /// ends as [`FinishReason::Length`](super::FinishReason::Length)).
    fn shortened(&self) -> bool {
        false
    }
}
