//! The recurrent state of a hybrid model's layers (issue 40): per recurrent layer, a fixed
//! number of *slots*, each one sequence's state in that layer (LFM2's short convolution: the
//! last `taps - 1` rows of its input; Mamba-2: its convolution's last inputs and the scan's
//! matrices). A sequence's slot is named in its batch segment as its
//! block table is (`BatchSegment::state_slot`); which slots are whose is the caller's policy
//! (the engine's state pool), never this module's.
//!
//! The state lives beside the paged K/V in the cache's storage (`arch::pass::DeviceKv`), in
//! host memory: recurrent layers run on the CPU.
//!
//! Invariants: every layer's slots are `floats[layer]` f32 values (0 for attention layers,
//! which hold none); a slot is valid for a sequence only after a pass over its positions
//! `0..n` wrote it; a pass whose segment starts at position 0 starts from a zero state (the
//! backend clears the slot), so a slot needs no reset between sequences.

/// Slots of every layer's recurrent state, and the slots of the current pass's segments.
#[derive(Debug, Clone, Default)]
pub struct RecurrentStates {
    slots: usize,
    floats: Vec<usize>,
    data: Vec<Vec<f32>>,
    /// The slot of each segment of the pass being run, in segment order.
    batch: Vec<u32>,
}

impl RecurrentStates {
    /// `slots` zeroed slots of `floats[i]` values for each layer `i`.
    pub fn new(floats: &[usize], slots: usize) -> Self {
        let slots = if floats.iter().any(|&f| f > 0) {
            slots
        } else {
            0
        };
        RecurrentStates {
            slots,
            floats: floats.to_vec(),
            data: floats.iter().map(|&f| vec![0.0; f * slots]).collect(),
            batch: Vec::new(),
        }
    }

    /// Every layer's state remade with `slots` zeroed slots (a server sizes them to its
    /// sequences).
    pub fn set_slots(&mut self, slots: usize) {
        *self = RecurrentStates::new(&self.floats, slots);
    }

    /// Slots per layer (0 for a model without recurrent layers).
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes of state held.
    pub fn memory_bytes(&self) -> usize {
        self.data.iter().map(|d| d.len() * 4).sum()
    }

    /// Sets the slots of the next pass's segments (one per segment, each below
    /// [`RecurrentStates::slots`]: the caller checked).
    pub fn bind(&mut self, slots: impl IntoIterator<Item = u32>) {
        self.batch.clear();
        self.batch.extend(slots);
    }

    /// Layer `layer`'s state: its values per slot, every slot's values, and the slots of the
    /// current pass's segments. `None` for a layer without state.
    pub fn layer_mut(&mut self, layer: usize) -> Option<(usize, &mut [f32], &[u32])> {
        let floats = *self.floats.get(layer)?;
        if floats == 0 {
            return None;
        }
        Some((floats, &mut self.data[layer], &self.batch))
    }

    /// Copies slot `src` into slot `dst` in every layer (a fork of a sequence, `n > 1`).
    pub fn copy_slot(&mut self, src: u32, dst: u32) {
        let (src, dst) = (src as usize, dst as usize);
        if src >= self.slots || dst >= self.slots || src == dst {
            return;
        }
        for (data, &f) in self.data.iter_mut().zip(&self.floats) {
            data.copy_within(src * f..(src + 1) * f, dst * f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_per_layer_and_copy_between_sequences() {
        let mut s = RecurrentStates::new(&[4, 0, 2], 3);
        assert_eq!(s.slots(), 3);
        assert_eq!(s.memory_bytes(), (4 + 2) * 3 * 4);
        assert!(s.layer_mut(1).is_none());
        s.bind([2, 0]);
        let (f, data, batch) = s.layer_mut(0).unwrap();
        assert_eq!((f, batch), (4, &[2u32, 0][..]));
        data[8..12].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        s.copy_slot(2, 1);
        let (_, data, _) = s.layer_mut(0).unwrap();
        assert_eq!(&data[4..8], &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(RecurrentStates::new(&[0, 0], 8).slots(), 0);
    }
}
