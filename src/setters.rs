//! Chainable setters for the public settings structs, which are `#[non_exhaustive]` so that a new
//! setting is not a breaking change: outside the crate they are built as `Default::default()` followed
//! by setters (`GenerateParams::default().max_tokens(64)`), never as struct literals.

/// `setters!(Type { field: FieldType, … })`: one `pub fn field(self, value) -> Self` per field, documented
/// as setting that field.
macro_rules! setters {
    ($ty:ty { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}
