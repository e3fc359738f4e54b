// The tokenized-jsonl cache: training on jsonl keeps what it tokenized as token shards
// (token_shards.h) in a directory named by a hash of the files' contents, the tokenizer, the data
// options and the glm_hpc binary, and maps them on the next run instead of tokenizing again.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "data/dataset.h"
#include "data/tokenizer.h"

namespace glm {

// $XDG_CACHE_HOME/glm_hpc/datasets, else $HOME/.cache/glm_hpc/datasets; "" when neither is set.
std::string default_dataset_cache_dir();

// What load_dataset takes, besides the files.
struct DatasetLoadOptions {
  const Tokenizer* tokenizer = nullptr;
  int64_t max_length = 0;
  int64_t vocab_size = 0;
  bool skip_bad = false;
  Truncation truncation = Truncation::remove;
  ConversationOptions conversation;
};

struct CachedDataset {
  Dataset dataset;
  std::string note;  // one line saying what the cache did (for rank 0 to print), or ""
};

// load_dataset through the cache in `cache_dir` ("" = no cache; a prepared directory is read as
// it is). A hit maps the cached shards; a miss tokenizes, and with `write` (one rank of a job)
// stores the result, under a temporary name renamed into place. Trouble with the cache itself (a
// damaged entry, a full disk) never fails the load: it is reported in the note and the files are
// tokenized as without a cache. Errors in the data are load_dataset's.
Result<CachedDataset> load_dataset_cached(const std::string& cache_dir, bool write,
                                          const std::vector<std::string>& paths, const DatasetLoadOptions& options);

}  // namespace glm
