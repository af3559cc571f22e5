// PNG heatmaps through libpng.

#include <png.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "headlight/core/atomic_file.h"
#include "headlight/core/error.h"
#include "headlight/viz/report.h"

namespace headlight::viz {

void write_heatmap_png(AtomicFile& out, const float* p, int64_t rows, int64_t cols, int cell) {
  check(rows > 0 && cols > 0 && cell > 0 && rows * cell <= 65536 && cols * cell <= 65536,
        "heatmap: {} × {} entries of {} pixels do not make a valid image", rows, cols, cell);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    fail("heatmap: libpng failed to encode it");
  }
  const auto width = static_cast<png_uint_32>(cols * cell),
             height = static_cast<png_uint_32>(rows * cell);
  png_init_io(png, out.stream());
  png_set_IHDR(png, info, width, height, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  std::vector<png_byte> line(static_cast<size_t>(width) * 3);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = std::min(1.0f, std::max(0.0f, p[r * cols + c]));
      // White (255, 255, 255) to dark blue (8, 48, 107).
      const png_byte rgb[3] = {static_cast<png_byte>(255 - v * 247),
                               static_cast<png_byte>(255 - v * 207),
                               static_cast<png_byte>(255 - v * 148)};
      for (int k = 0; k < cell; ++k)
        for (int ch = 0; ch < 3; ++ch) line[static_cast<size_t>((c * cell + k) * 3 + ch)] = rgb[ch];
    }
    for (int k = 0; k < cell; ++k) png_write_row(png, line.data());
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  out.commit();
}

}  // namespace headlight::viz
