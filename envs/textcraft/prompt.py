"""AgentGym's task instruction for TextCraft (its client's first user turn, ReAct format), verbatim:
models trained on AgentGym's trajectories expect exactly this text.
"""

INSTRUCTION = (
    "You are given few useful crafting recipes to craft items in Minecraft. Crafting commands "
    'are of the format "craft [target object] using [input ingredients]".\nEvery round I will '
    "give you an observation, you have to respond an action based on the state and instruction."
    ' You can "get" an object (ingredients) from the inventory or the environment, look-up the '
    'game inventory by "inventory", or "craft" (target) using any of the crafting commands.\n'
    'Your output must strictly follow this format:"Thought:\nyour thoughts.\n\nAction:\nyour next '
    'action"\n\nReminder: \n1. Always specify the quantity when using "get" and "craft" commands. '
    "- Example of get: get 1 lapis lazuli - Example1 of craft: craft 1 blue dye using 1 lapis "
    "lazuli - Example2 of craft: craft 1 golden carrot using 8 gold nugget, 1 carrot\n2. When "
    'using "get" command, do not specify whether the item comes from the inventory or the '
    "environment.\n3. You can use ONLY crafting commands provided, do not use your own crafting "
    'commands. However, if the crafting command uses a generic ingredient like "planks", you '
    'can use special types of the same ingredient e.g. "dark oak planks" in the command '
    "instead.\n\n"
)
