// The C++ floor under reading a prototxt (bench/textformat_floor.sh builds and runs it): the median time of
// google::protobuf::TextFormat::ParseFromString into a caffe::NetParameter, the parser Caffe itself uses.
//
//     parse NET.prototxt [REPEAT]
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "caffe.pb.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " NET.prototxt [REPEAT]\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  const int repeat = argc > 2 ? std::atoi(argv[2]) : 51;

  std::vector<double> millis;
  for (int i = 0; i < repeat; ++i) {
    caffe::NetParameter net;
    const auto start = std::chrono::steady_clock::now();
    const bool parsed = google::protobuf::TextFormat::ParseFromString(text, &net);
    const auto end = std::chrono::steady_clock::now();
    if (!parsed) {
      std::cerr << argv[1] << ": not a NetParameter\n";
      return 1;
    }
    millis.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  std::sort(millis.begin(), millis.end());
  std::cout << "median_ms " << millis[millis.size() / 2] << " bytes " << text.size() << "\n";
  return 0;
}
