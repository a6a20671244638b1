-- nd.image (spec/image_spec.lua has the rest of its errors)
return function(nd)
  local img = nd.zeros({3, 8, 8}, {dtype = "uint8"})
  return {rest = {
    {"image.read", "device, mode", function(o) return nd.image.read("spec/fixtures/images/rgb.png", o) end},
    {"image.resize", "mode", function(o) return nd.image.resize(img, 4, o) end},
    {"image.preprocess", "crop, mean, resize, std", function(o) return nd.image.preprocess(img, o) end},
  }}
end
