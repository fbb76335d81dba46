//! From text to token sets without leaving SQL, for `metric=jaccard`:
//!
//! * `shingles(text [, n])` — the word n-grams of `text` (n = 1: its words): a word is a maximal
//!   run of alphanumeric characters, lower-cased; consecutive words are joined by one space. A
//!   text of fewer than `n` (but some) words gives one shingle of all of them, so a short text
//!   still matches itself; a text of no word gives the empty list.
//! * `qgrams(text [, q])` — the character q-grams of `text` as written (Unicode scalar values,
//!   q = 3 by default, no padding); a text shorter than `q` (but not empty) gives itself.
//!
//! Both return a list of strings (NULL for a NULL text); duplicates stay in the list — a set
//! holds each once.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListBuilder, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

/// `shingles` and `qgrams`.
pub fn all() -> Vec<ScalarUDF> {
    vec![ScalarUDF::new_from_impl(Tokens::new(Kind::Shingles)), ScalarUDF::new_from_impl(Tokens::new(Kind::QGrams))]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Shingles,
    QGrams,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Tokens {
    kind: Kind,
    signature: Signature,
}

impl Tokens {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            signature: Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Immutable),
        }
    }

    fn name_of(&self) -> &'static str {
        match self.kind {
            Kind::Shingles => "shingles",
            Kind::QGrams => "qgrams",
        }
    }

    /// The default size (words of a shingle, characters of a gram).
    fn default_size(&self) -> usize {
        match self.kind {
            Kind::Shingles => 1,
            Kind::QGrams => 3,
        }
    }

    /// The tokens of `text`, appended to `out`.
    fn tokens(&self, text: &str, size: usize, out: &mut StringBuilder) -> usize {
        match self.kind {
            Kind::Shingles => {
                let words: Vec<String> = text
                    .split(|c: char| !c.is_alphanumeric())
                    .filter(|w| !w.is_empty())
                    .map(str::to_lowercase)
                    .collect();
                if words.is_empty() {
                    return 0;
                }
                if words.len() < size {
                    out.append_value(words.join(" "));
                    return 1;
                }
                for window in words.windows(size) {
                    out.append_value(window.join(" "));
                }
                words.len() - size + 1
            }
            Kind::QGrams => {
                let chars: Vec<char> = text.chars().collect();
                if chars.is_empty() {
                    return 0;
                }
                if chars.len() < size {
                    out.append_value(text);
                    return 1;
                }
                let mut gram = String::new();
                for window in chars.windows(size) {
                    gram.clear();
                    gram.extend(window);
                    out.append_value(&gram);
                }
                chars.len() - size + 1
            }
        }
    }
}

impl ScalarUDFImpl for Tokens {
    fn name(&self) -> &str {
        self.name_of()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let name = self.name_of();
        match arg_types.first() {
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null) => {}
            Some(t) => return plan_err!("{name}: argument 1 has type {t}, expected text"),
            None => return plan_err!("{name}: expected a text argument"),
        }
        if let Some(t) = arg_types.get(1)
            && !t.is_integer()
        {
            return plan_err!("{name}: argument 2 has type {t}, expected a positive integer size");
        }
        Ok(DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true))))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.name_of();
        let rows = args.number_rows;
        let size = match args.args.get(1) {
            None => self.default_size(),
            Some(ColumnarValue::Scalar(value)) => match value.cast_to(&DataType::Int64)? {
                ScalarValue::Int64(Some(n)) if n >= 1 => n as usize,
                other => return exec_err!("{name}: argument 2 must be a positive integer, got {other}"),
            },
            Some(ColumnarValue::Array(_)) => return exec_err!("{name}: argument 2 must be a constant size"),
        };
        let constant = matches!(args.args[0], ColumnarValue::Scalar(_));
        let texts = cast(&args.args[0].to_array(rows)?, &DataType::Utf8)?;
        let texts = texts.as_string::<i32>();
        let mut out = ListBuilder::new(StringBuilder::new());
        for row in 0..texts.len() {
            if texts.is_null(row) {
                out.append_null();
                continue;
            }
            self.tokens(texts.value(row), size, out.values());
            out.append(true);
        }
        let result: ArrayRef = Arc::new(out.finish());
        if constant {
            return Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&result, 0)?));
        }
        Ok(ColumnarValue::Array(result))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::StringBuilder;

    use super::{Kind, Tokens};

    fn tokens(kind: Kind, text: &str, size: usize) -> Vec<String> {
        let mut out = StringBuilder::new();
        let n = Tokens::new(kind).tokens(text, size, &mut out);
        let array = out.finish();
        (0..n).map(|i| array.value(i).to_string()).collect()
    }

    #[test]
    fn shingles_are_lower_cased_word_windows() {
        assert_eq!(tokens(Kind::Shingles, "The quick, quick fox!", 2), ["the quick", "quick quick", "quick fox"]);
        assert_eq!(tokens(Kind::Shingles, "Ünïcode wörds", 1), ["ünïcode", "wörds"]);
        assert_eq!(tokens(Kind::Shingles, "one", 3), ["one"]);
        assert!(tokens(Kind::Shingles, "  ,; ", 2).is_empty());
    }

    #[test]
    fn qgrams_are_character_windows() {
        assert_eq!(tokens(Kind::QGrams, "abcd", 3), ["abc", "bcd"]);
        assert_eq!(tokens(Kind::QGrams, "né", 3), ["né"]);
        assert_eq!(tokens(Kind::QGrams, "日本語", 2), ["日本", "本語"]);
        assert!(tokens(Kind::QGrams, "", 3).is_empty());
    }
}
