// placeholder until the part layer lands
