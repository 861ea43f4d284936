// Publishing to a serving-only directory (the policy's serving_dir; docs/serving.md, "A
// serving-only directory"). Once a version of the checkpoint directory commits, its tables'
// values-only files (written beside its row files when the policy has a serving_dir, fulls
// included) become a version of the serving directory: the same version number, kind and
// lineage, its row files those values-only files (hard links, or copies across file systems),
// its manifest serving-only (io/format/manifest.hpp) with no admission counts or attachments,
// and a delta's parent the serving directory's own version of that number. Followers follow it
// as any checkpoint directory; restores refuse it.
//
// liburing style: 0 or -errno, with what went wrong (naming the path) in *detail.
#pragma once

#include <string>

namespace embstore::checkpoint {

// Publishes the committed version at version_path (a version directory of a checkpoint
// directory) into serving_dir (which must exist; the caller holds its writer lock). A crash's
// leftovers there, and its versions of a run abandoned at an older version (at or above a full,
// above a delta's parent), are deleted first; -ENOTEMPTY when one of those is not serving-only.
// -ENODATA: the version has no values-only files; -ENOENT: a delta whose parent (the serving
// version published from the very version it applies on) serving_dir does not hold: its chain
// starts again at the next full checkpoint; else the error of a read, link, copy, write or
// commit. Nothing is left in serving_dir on failure (the staging directory is rolled back).
int publish_serving(const std::string& version_path, const std::string& serving_dir,
                    std::string* detail);

}  // namespace embstore::checkpoint
