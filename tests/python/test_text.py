"""TfIdfVectorizer over integer tokens on the MLX EP against ORT's CPU EP (every mode, n-gram
lengths, skips, 1-D and batched input, remapped output columns, weights), and the declines."""
import numpy as np
import pytest

from oracle import check_node, make_node_model, placement_of

rng = np.random.default_rng(9)

POOL = dict(ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
            pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
@pytest.mark.parametrize("lengths", [(1, 1), (1, 2), (2, 2)])
@pytest.mark.parametrize("skip", [0, 1, 5])
@pytest.mark.parametrize("shape", [(12,), (3, 8), (2, 1)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_tfidf(mode, lengths, skip, shape, dtype):
    x = rng.integers(1, 9, size=shape).astype(dtype)
    attrs = dict(POOL, mode=mode, min_gram_length=lengths[0], max_gram_length=lengths[1],
                 max_skip_count=skip)
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


@pytest.mark.parametrize("mode", ["IDF", "TFIDF"])
def test_tfidf_weights_and_remapped_columns(mode):
    # trigrams too, columns permuted, one weight per pool entry (applied in its column)
    x = rng.integers(0, 4, size=(4, 20)).astype(np.int64)
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=3, max_skip_count=2,
                 ngram_counts=[0, 3, 7],
                 pool_int64s=[0, 1, 3, 0, 1, 2, 2, 3, 3, 1, 0, 1, 2, 3, 3, 0],
                 ngram_indexes=[6, 0, 2, 7, 1, 3, 5, 4],
                 weights=[0.5, 2.0, 1.5, 3.0, 0.25, 1.0, 4.0, 0.75])
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_empty_unigram_level():
    # ngram_counts [0, 0]: no unigrams, the whole pool is bigrams (ONNX's "levelempty" case)
    x = np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)
    attrs = dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=0,
                 ngram_counts=[0, 0], ngram_indexes=[0, 1, 2], pool_int64s=[5, 6, 7, 8, 6, 7])
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_unused_column():
    # a column no pool entry maps to stays zero
    x = rng.integers(1, 9, size=(2, 10)).astype(np.int64)
    attrs = dict(POOL, mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=1,
                 ngram_indexes=[0, 1, 2, 3, 5, 6, 8])
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_row_shorter_than_the_ngrams():
    x = np.array([[4, 5], [6, 7]], np.int64)
    attrs = dict(POOL, mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=3)
    check_node("TfIdfVectorizer", {"X": x}, attrs, opset=9)


def test_tfidf_repeated_pool_ngram_is_declined():
    x = np.array([2, 3, 2, 3], np.int64)
    attrs = dict(mode="TF", min_gram_length=1, max_gram_length=1, max_skip_count=0,
                 ngram_counts=[0], ngram_indexes=[0, 1], pool_int64s=[2, 2])
    model = make_node_model("TfIdfVectorizer", {"X": x}, 1, attrs, opset=9)
    # Declined, so the node goes to ORT's CPU kernel, which rejects the pool at session creation
    # (had the EP claimed it, the session would be created).
    with pytest.raises(Exception, match="Duplicate ngram"):
        placement_of(model, {"X": x})
