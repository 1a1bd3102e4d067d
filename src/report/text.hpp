// Formatting shared by the run log and its sections: printf into a string, sizes and
// durations for people, numbers for JSON.
#pragma once

#include <string>

namespace tessera {

std::string formatted(const char* f, ...) __attribute__((format(printf, 1, 2)));
std::string human_bytes(double b);     // "1.5 MiB"
std::string human_duration(double s);  // "42s", "3m07s", "2h05m"
// A number for JSON: NaN and Inf (a skipped non-finite step) have no JSON form, so null.
std::string json_number(double x);

}  // namespace tessera
